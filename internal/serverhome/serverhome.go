// Package serverhome is the layout of a bgtask server's home directory, shared by the
// server that keeps it and the clients that find the server through it: where the
// server listens (its discovery file), the identities it generated, its lock, the
// ports it keeps across restarts, the HTTP API's file and tokens, the webhook
// secret, and whether a supervisor restarts it.
package serverhome

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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/sys/unix"

	"github.com/bgtask/bgtask/internal/secretenv"
)

// A home directory holds one server's state: its JetStream store, the Identities
// it generated, the Discovery file clients read to find it, the port it last
// listened on, and the snapshot of its projection.
const (
	CredentialsFile = "credentials.json"
	ClientSeedFile  = "client.nkey"
	WorkerSeedFile  = "worker.nkey"
	DiscoveryFile   = "server.json"
	PortFile        = "server.port"
	HTTPPortFile    = "http.port"
	LockFile        = "server.lock"
	SupervisorFile  = "supervisor"
	StoreDir        = "jetstream"
	SnapshotFile    = "projection.snapshot"
)

// Dir is the home a flag names, else $BGTASK_HOME, else a per-user default
// ($XDG_STATE_HOME/bgtask or ~/.local/state/bgtask), as an absolute path.
func Dir(flag string) (string, error) {
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

// Credentials are one nkey identity of the embedded server. The server holds only
// the public keys; no password ever crosses a connection.
type Credentials struct {
	Seed string `json:"nkey_seed"`
}

// PublicKey is the nkey user the embedded server knows this identity by.
func (c Credentials) PublicKey() (string, error) {
	key, err := newLoginKey(c.Seed)
	if err != nil {
		return "", err
	}
	return key.PublicKey()
}

// decodes checks the seed without deriving its key, which costs a connect's
// signature: a command that reads the credentials connects with them at most once.
func (c Credentials) decodes() error {
	_, _, err := nkeys.DecodeSeed([]byte(c.Seed))
	return err
}

// NATSOption authenticates a connection by signing the server's nonce. The seed
// is held (secretenv.Hold): no command gets it, under any name.
func (c Credentials) NATSOption() (nats.Option, error) {
	key, err := newLoginKey(c.Seed)
	if err != nil {
		return nil, err
	}
	secretenv.Hold(c.Seed)
	pub, err := key.PublicKey()
	if err != nil {
		return nil, err
	}
	return nats.Nkey(pub, key.Sign), nil
}

// NewCredentials generates a user nkey.
func NewCredentials() (Credentials, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return Credentials{}, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return Credentials{}, err
	}
	return Credentials{Seed: string(seed)}, nil
}

// Identities are the embedded server's users that live on disk, each with the
// least it needs (see permissions.go). The engine's identity is not among them: it
// is generated at each start and never leaves the server's memory.
type Identities struct {
	// Client is what the CLI and the user's own programs connect as
	// (credentials.json, and client.nkey for the nats CLI).
	Client Credentials
	// Worker is what a `bgtask worker --home` process, and the server's own
	// worker, connect as (worker.nkey).
	Worker Credentials
}

// LoadOrCreateIdentities reads the home's Identities, generating each (mode 0600)
// the first time. client.nkey is rewritten from credentials.json at every start,
// so the two never name different users.
func LoadOrCreateIdentities(home string) (Identities, error) {
	var ids Identities
	client, err := ReadCredentials(home)
	if errors.Is(err, fs.ErrNotExist) {
		if client, err = NewCredentials(); err == nil {
			data, _ := json.MarshalIndent(client, "", "  ")
			err = WriteFileAtomic(filepath.Join(home, CredentialsFile), data)
		}
	}
	if err != nil {
		return ids, err
	}
	if err := WriteFileAtomic(filepath.Join(home, ClientSeedFile), []byte(client.Seed)); err != nil {
		return ids, err
	}
	worker, err := ReadSeedFile(filepath.Join(home, WorkerSeedFile))
	if errors.Is(err, fs.ErrNotExist) {
		if worker, err = NewCredentials(); err == nil {
			err = WriteFileAtomic(filepath.Join(home, WorkerSeedFile), []byte(worker.Seed))
		}
	}
	if err != nil {
		return ids, err
	}
	return Identities{Client: client, Worker: worker}, nil
}

// ReadCredentials reads the client identity of the home's server, the one every
// client command connects as.
func ReadCredentials(home string) (Credentials, error) {
	var creds Credentials
	data, err := os.ReadFile(filepath.Join(home, CredentialsFile))
	if err != nil {
		return creds, err
	}
	if err := json.Unmarshal(data, &creds); err != nil || creds.Seed == "" {
		return creds, fmt.Errorf("%s is damaged: remove it and restart the server to generate new credentials", filepath.Join(home, CredentialsFile))
	}
	if err := creds.decodes(); err != nil {
		return creds, fmt.Errorf("%s is damaged (%v): remove it and restart the server to generate new credentials", filepath.Join(home, CredentialsFile), err)
	}
	return creds, nil
}

// ReadSeedFile reads an nkey seed file, as the nats CLI and --nkey read them.
func ReadSeedFile(path string) (Credentials, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, err
	}
	creds := Credentials{Seed: strings.TrimSpace(string(data))}
	if err := creds.decodes(); err != nil {
		return Credentials{}, fmt.Errorf("%s is damaged (%v): remove it and restart the server to generate a new one", path, err)
	}
	return creds, nil
}

// Discovery tells clients where the server listens.
type Discovery struct {
	URL     string `json:"url"`
	PID     int    `json:"pid"`
	Version string `json:"version"`
}

func ReadDiscovery(home string) (Discovery, error) {
	var d Discovery
	data, err := os.ReadFile(filepath.Join(home, DiscoveryFile))
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(data, &d); err != nil || d.URL == "" {
		return d, fmt.Errorf("%s is damaged", filepath.Join(home, DiscoveryFile))
	}
	return d, nil
}

// Dialer dials the server where the home's discovery file says it is at the
// moment of the dial, so that a long-lived connection (a worker's) follows a
// server restarted on another port: a restart keeps its port only while no other
// program has taken it. Without a discovery file it dials where it was told.
type Dialer struct {
	home   string
	dialer net.Dialer
}

// NewDialer dials the server of home, giving up on an address after timeout.
func NewDialer(home string, timeout time.Duration) *Dialer {
	return &Dialer{home: home, dialer: net.Dialer{Timeout: timeout}}
}

// Dial is nats.CustomDialer's.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	if disc, err := ReadDiscovery(d.home); err == nil {
		if u, err := url.Parse(disc.URL); err == nil && u.Host != "" {
			address = u.Host
		}
	}
	return d.dialer.Dial(network, address)
}

// WriteDiscovery tells clients where the server is: written last, once it serves.
func WriteDiscovery(home string, d Discovery) error {
	data, _ := json.MarshalIndent(d, "", "  ")
	return WriteFileAtomic(filepath.Join(home, DiscoveryFile), data)
}

// RememberPort keeps a port the server listens on past its stop in HOME/file
// (server.json and http.json go with a clean stop, this file stays), so that the
// next start with port 0 listens there again: workers reconnect at once, a saved
// nats context, a scraper and a dashboard's tab still point at the server.
func RememberPort(home, file string, port int) error {
	return WriteFileAtomic(filepath.Join(home, file), []byte(strconv.Itoa(port)))
}

// RememberedPort is the port HOME/file keeps, or 0.
func RememberedPort(home, file string) int {
	data, err := os.ReadFile(filepath.Join(home, file))
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || port <= 0 || port > 65535 {
		return 0
	}
	return port
}

// WriteFileAtomic writes a file readable by its owner only, ending in a newline.
func WriteFileAtomic(path string, data []byte) error {
	return ReplaceFile(path, append(data, '\n'), 0o600)
}

// ReplaceFile replaces path with data, with mode: a temp file beside it, fsync,
// rename, fsync of the directory, so a reader sees the old file or the new one,
// never half of one, and the new one is on disk when it returns.
func ReplaceFile(path string, data []byte, mode fs.FileMode) error {
	return ReplaceFileAs(path, data, mode, -1, -1)
}

// ReplaceFileAs is ReplaceFile with the new file owned by uid and gid (-1: this
// process's).
func ReplaceFileAs(path string, data []byte, mode fs.FileMode, uid, gid int) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if uid >= 0 || gid >= 0 {
		if err := tmp.Chown(uid, gid); err != nil {
			tmp.Close()
			return fmt.Errorf("keep the owner (uid %d, gid %d): %w", uid, gid, err)
		}
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
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
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Lock takes the home's exclusive lock, held for the server's life. The kernel
// drops it when the process dies, even by kill -9, so a crash never leaves it stale.
// A client that asks whether a server lives (Locked) holds a shared lock for
// an instant: a start that meets one tries again for a while.
func Lock(home string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(home, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	for give := time.Now().Add(time.Second); errors.Is(err, unix.EWOULDBLOCK) && time.Now().Before(give); {
		time.Sleep(10 * time.Millisecond)
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another bgtask server"
			if d, derr := ReadDiscovery(home); derr == nil {
				who += " (pid " + strconv.Itoa(d.PID) + ", " + d.URL + ")"
			}
			return nil, fmt.Errorf("%s is already running with home %s", who, home)
		}
		return nil, fmt.Errorf("lock %s: %w", filepath.Join(home, LockFile), err)
	}
	return f, nil
}

// Locked reports whether a process holds the home's lock: a server that runs,
// or one that is starting and does not answer yet.
func Locked(home string) (bool, error) {
	f, err := os.Open(filepath.Join(home, LockFile))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

// SupervisedEnv names the variable that tells a server a supervisor restarts it
// when it stops ('bgtask service install' sets it in the unit it writes); its
// value names the supervisor.
const SupervisedEnv = "BGTASK_SUPERVISED"

// RecordSupervisor keeps, past this server's stop, whether something restarts
// the home's server, for clients to know whether to wait for it.
func RecordSupervisor(home string) error {
	path := filepath.Join(home, SupervisorFile)
	if by := os.Getenv(SupervisedEnv); by != "" {
		return WriteFileAtomic(path, []byte(by))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Gone says why no server will answer in home again without someone
// starting one: no process holds its lock and no supervisor restarts it. nil: a
// server lives (maybe starting) or is restarted by its supervisor, or it cannot
// tell.
func Gone(home string) error {
	if locked, err := Locked(home); err != nil || locked {
		return nil
	}
	if _, err := os.Stat(filepath.Join(home, SupervisorFile)); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	last := "its server stopped"
	if d, err := ReadDiscovery(home); err == nil {
		last = fmt.Sprintf("its server (pid %d) is gone", d.PID)
	}
	return fmt.Errorf("no bgtask server runs in %s: %s, and no service restarts it; start it with 'bgtask server', or keep it running with 'bgtask service install --user'", home, last)
}
