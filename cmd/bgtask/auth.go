package main

import (
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// natsAuth is how a connection to a NATS deployment of your own authenticates:
// a creds file (JWT and nkey seed), an nkey seed file, or a user and password;
// and TLS, with a CA to trust and a client certificate if the server wants one.
type natsAuth struct {
	creds, nkey            string
	user, password         string
	tlsCA, tlsCert, tlsKey string
}

func (a *natsAuth) register(f *pflag.FlagSet) {
	f.StringVar(&a.creds, "creds", "", "NATS credentials file (JWT and nkey seed), with --nats")
	f.StringVar(&a.nkey, "nkey", "", "file holding a NATS nkey seed (SU...), with --nats")
	f.StringVar(&a.user, "user", "", "NATS user, with --nats")
	f.StringVar(&a.password, "password", "", "NATS password, with --nats (better: $BGTASK_NATS_PASSWORD, which ps does not show)")
	f.StringVar(&a.tlsCA, "tls-ca", "", "PEM file of the CA that signed the NATS servers' certificates, with --nats")
	f.StringVar(&a.tlsCert, "tls-cert", "", "PEM client certificate for NATS servers that verify clients, with --nats and --tls-key")
	f.StringVar(&a.tlsKey, "tls-key", "", "PEM key of --tls-cert")
}

func (a *natsAuth) given() bool {
	return a.creds != "" || a.nkey != "" || a.user != "" || a.password != "" || a.tlsCA != "" || a.tlsCert != "" || a.tlsKey != ""
}

// options turns the flags into connection options; at most one identity.
func (a *natsAuth) options() ([]nats.Option, error) {
	var opts []nats.Option
	identities := 0
	if a.creds != "" {
		identities++
		if err := holdCredsSeed(a.creds); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserCredentials(a.creds))
	}
	if a.nkey != "" {
		identities++
		opt, err := nkeyOption(a.nkey)
		if err != nil {
			return nil, err
		}
		opts = append(opts, opt)
	}
	password := a.password
	if password == "" {
		password = os.Getenv("BGTASK_NATS_PASSWORD")
	}
	switch {
	case a.user != "":
		identities++
		secretenv.Hold(password)
		opts = append(opts, nats.UserInfo(a.user, password))
	case a.password != "":
		return nil, usageErr("--password: give --user too")
	}
	if identities > 1 {
		return nil, usageErr("--creds, --nkey and --user: give one identity")
	}
	tls, err := a.tlsOptions()
	return append(opts, tls...), err
}

// tlsOptions are the TLS part of the options alone.
func (a *natsAuth) tlsOptions() ([]nats.Option, error) {
	if (a.tlsCert == "") != (a.tlsKey == "") {
		return nil, usageErr("--tls-cert and --tls-key: give both")
	}
	var opts []nats.Option
	if a.tlsCA != "" {
		opts = append(opts, nats.RootCAs(a.tlsCA))
	}
	if a.tlsCert != "" {
		opts = append(opts, nats.ClientCert(a.tlsCert, a.tlsKey))
	}
	return opts, nil
}

// holdCredsSeed holds the nkey seed of a creds file (secretenv.Hold), which the
// connection reads again at each connect.
func holdCredsSeed(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return usageErr("--creds: %v", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return usageErr("--creds %s: no user nkey seed: %v", file, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return usageErr("--creds %s: %v", file, err)
	}
	secretenv.Hold(string(seed))
	return nil
}

// nkeyOption signs the server's nonce with the user nkey whose seed is in file.
func nkeyOption(file string) (nats.Option, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, usageErr("--nkey: %v", err)
	}
	opt, err := serverhome.Credentials{Seed: strings.TrimSpace(string(data))}.NATSOption()
	if err != nil {
		return nil, usageErr("--nkey %s: not an nkey seed: %v", file, err)
	}
	return opt, nil
}
