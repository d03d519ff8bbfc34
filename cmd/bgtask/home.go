package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/sys/unix"
)

// A home directory holds one server's state: its JetStream store, the credentials
// it generated, the discovery file clients read to find it, the port it last
// listened on, and the snapshot of its projection.
const (
	credentialsFile = "credentials.json"
	discoveryFile   = "server.json"
	portFile        = "server.port"
	lockFile        = "server.lock"
	storeDir        = "jetstream"
	snapshotFile    = "projection.snapshot"
)

// homeDir resolves --home, else $BGTASK_HOME, else a per-user default.
func homeDir(flag string) (string, error) {
	dir := flag
	if dir == "" {
		dir = os.Getenv("BGTASK_HOME")
	}
	if dir == "" {
		state := os.Getenv("XDG_STATE_HOME")
		if state == "" {
			userHome, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("no home directory: give --home or set BGTASK_HOME: %w", err)
			}
			state = filepath.Join(userHome, ".local", "state")
		}
		dir = filepath.Join(state, "bgtask")
	}
	return filepath.Abs(dir)
}

// credentials authenticate every client of the embedded server: an nkey, so the
// server's configuration holds only the public key and no password ever crosses the
// connection.
type credentials struct {
	Seed string `json:"nkey_seed"`
}

func (c credentials) keyPair() (nkeys.KeyPair, error) {
	return nkeys.FromSeed([]byte(c.Seed))
}

// publicKey is the user the embedded server lets in.
func (c credentials) publicKey() (string, error) {
	kp, err := c.keyPair()
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// natsOption authenticates a connection by signing the server's nonce.
func (c credentials) natsOption() (nats.Option, error) {
	kp, err := c.keyPair()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.Nkey(pub, kp.Sign), nil
}

// loadOrCreateCredentials reads the home's credentials, generating them (mode 0600)
// the first time.
func loadOrCreateCredentials(home string) (credentials, error) {
	path := filepath.Join(home, credentialsFile)
	creds, err := readCredentials(home)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return creds, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return credentials{}, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return credentials{}, err
	}
	creds = credentials{Seed: string(seed)}
	data, _ := json.MarshalIndent(creds, "", "  ")
	return creds, writeFileAtomic(path, data)
}

func readCredentials(home string) (credentials, error) {
	var creds credentials
	data, err := os.ReadFile(filepath.Join(home, credentialsFile))
	if err != nil {
		return creds, err
	}
	if err := json.Unmarshal(data, &creds); err != nil || creds.Seed == "" {
		return creds, fmt.Errorf("%s is damaged: remove it and restart the server to generate new credentials", filepath.Join(home, credentialsFile))
	}
	return creds, nil
}

// discovery tells clients where the server listens.
type discovery struct {
	URL     string `json:"url"`
	PID     int    `json:"pid"`
	Version string `json:"version"`
}

func readDiscovery(home string) (discovery, error) {
	var d discovery
	data, err := os.ReadFile(filepath.Join(home, discoveryFile))
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(data, &d); err != nil || d.URL == "" {
		return d, fmt.Errorf("%s is damaged", filepath.Join(home, discoveryFile))
	}
	return d, nil
}

// discoveryDialer dials the server where the home's discovery file says it is at
// the moment of the dial, so that a long-lived connection (a worker's) follows a
// server restarted on another port: a restart keeps its port only while no other
// program has taken it. Without a discovery file it dials where it was told.
type discoveryDialer struct {
	home   string
	dialer net.Dialer
}

func (d *discoveryDialer) Dial(network, address string) (net.Conn, error) {
	if disc, err := readDiscovery(d.home); err == nil {
		if u, err := url.Parse(disc.URL); err == nil && u.Host != "" {
			address = u.Host
		}
	}
	return d.dialer.Dial(network, address)
}

func writeDiscovery(home string, d discovery) error {
	data, _ := json.MarshalIndent(d, "", "  ")
	return writeFileAtomic(filepath.Join(home, discoveryFile), data)
}

// rememberPort keeps the port the server listens on past its stop (server.json
// goes with a clean stop, this file stays), so that the next start with port 0
// listens there again: workers reconnect at once, and a saved nats context still
// points at the server.
func rememberPort(home string, port int) error {
	return writeFileAtomic(filepath.Join(home, portFile), []byte(strconv.Itoa(port)))
}

// rememberedPort is the port of the home's last server, or 0.
func rememberedPort(home string) int {
	data, err := os.ReadFile(filepath.Join(home, portFile))
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || port <= 0 || port > 65535 {
		return 0
	}
	return port
}

// writeFileAtomic writes a file readable by its owner only: a temp file, fsync,
// rename, so a reader never sees half of it.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// lockHome takes the home's exclusive lock, held for the server's life. The kernel
// drops it when the process dies, even by kill -9, so a crash never leaves it stale.
func lockHome(home string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(home, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another bgtask server"
			if d, derr := readDiscovery(home); derr == nil {
				who += " (pid " + strconv.Itoa(d.PID) + ", " + d.URL + ")"
			}
			return nil, fmt.Errorf("%s is already running with home %s", who, home)
		}
		return nil, fmt.Errorf("lock %s: %w", filepath.Join(home, lockFile), err)
	}
	return f, nil
}
