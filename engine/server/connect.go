package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/internal/serverhome"
)

// Deployment is where a process of bgtask connects: the NATS deployment of URL
// with the options of the auth and TLS flags, or, with no URL, the server of
// the home, found through its discovery file, as an identity the home keeps.
type Deployment struct {
	// Home is the --home flag: "" is $BGTASK_HOME or the per-user default.
	Home string
	// URL is --nats: the NATS URL(s) of a deployment of your own, comma separated.
	URL string
	// Auth are the connection options of the auth and TLS flags, with URL.
	Auth []nats.Option
}

// Connect opens a connection named name to URL with Auth, else to the home's
// server as its client identity: for a part of the server, or a program, that
// acts as a client of it.
func (d Deployment) Connect(name string, extra ...nats.Option) (*nats.Conn, error) {
	return d.connectAs(name, serverhome.ReadCredentials, extra...)
}

// workerIdentity is the identity a worker process reads from the home.
func workerIdentity(home string) (serverhome.Credentials, error) {
	return serverhome.ReadSeedFile(filepath.Join(home, serverhome.WorkerSeedFile))
}

// connectAs opens a connection named name: to URL with Auth, else to the home's
// server as the identity that identity reads from the home.
func (d Deployment) connectAs(name string, identity func(home string) (serverhome.Credentials, error), extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{nats.Name(name), nats.Timeout(5 * time.Second), nats.MaxReconnects(-1)}, extra...)
	if d.URL != "" {
		nc, err := nats.Connect(d.URL, append(opts, d.Auth...)...)
		if err != nil {
			return nil, fmt.Errorf("connect to %s: %w", d.URL, err)
		}
		return nc, nil
	}
	home, err := serverhome.Dir(d.Home)
	if err != nil {
		return nil, err
	}
	disc, err := serverhome.ReadDiscovery(home)
	if errors.Is(err, os.ErrNotExist) {
		// A server writes its credentials at its first start and removes its
		// discovery file when it stops: with credentials, one ran here and may be
		// starting again.
		return nil, fmt.Errorf("the bgtask server of %s is not running (it wrote no %s yet)", home, serverhome.DiscoveryFile)
	}
	if err != nil {
		return nil, err
	}
	creds, err := identity(home)
	if err != nil {
		return nil, fmt.Errorf("read the identity of %s: %w", name, err)
	}
	auth, err := creds.NATSOption()
	if err != nil {
		return nil, fmt.Errorf("read the identity of %s: %w", name, err)
	}
	// Reconnects go where the server is now, should it come back on another port.
	opts = append(opts, auth, nats.SetCustomDialer(serverhome.NewDialer(home, 5*time.Second)))
	nc, err := nats.Connect(disc.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("the bgtask server of %s (pid %d, %s) does not answer: %w", home, disc.PID, disc.URL, err)
	}
	return nc, nil
}
