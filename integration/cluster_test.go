package integration

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bgtask/bgtask/events/eventstest"
	"github.com/bgtask/bgtask/internal/testkit"
)

// deployment is a NATS JetStream cluster configured with the shipped account and
// permissions (deploy/nats/accounts.conf), and the passwords of its identities.
type deployment struct {
	cluster   *eventstest.Cluster
	passwords map[string]string // engine, worker, client
}

// startDeployment starts n clustered nodes on loopback with the shipped permissions.
// configure, if given, changes each node's options further.
func startDeployment(t *testing.T, n int, configure ...func(int, *server.Options)) *deployment {
	t.Helper()
	d := &deployment{passwords: map[string]string{}}
	conf, err := os.ReadFile("../deploy/nats/accounts.conf")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped file reads the passwords from the server's environment; the
	// test writes them in, so that parallel tests need no environment of their own.
	text := string(conf)
	for _, user := range []string{"engine", "worker", "client"} {
		d.passwords[user] = randomPassword(t)
		text = strings.ReplaceAll(text, "$BGTASK_"+strings.ToUpper(user)+"_PASSWORD", `"`+d.passwords[user]+`"`)
	}
	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cluster = eventstest.RunCluster(t, n, func(_ int, o *server.Options) {
		parsed, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("deploy/nats/accounts.conf: %v", err)
		}
		o.Accounts, o.Users = parsed.Accounts, parsed.Users
	}, func(i int, o *server.Options) {
		for _, c := range configure {
			c(i, o)
		}
	})
	return d
}

func randomPassword(t *testing.T) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// args are the connection flags of a bgtask command that connects as user.
func (d *deployment) args(user string, rest ...string) []string {
	return append([]string{"--nats", d.cluster.URLs(), "--user", user}, rest...)
}

// env gives a bgtask command the password of user, and the client's password to
// the engine, which checks what the client identity may do.
func (d *deployment) env(user string) []string {
	return []string{"BGTASK_NATS_PASSWORD=" + d.passwords[user], "BGTASK_CLIENT_PASSWORD=" + d.passwords["client"]}
}

// start runs a long-lived bgtask process (server or worker) connected as user.
func (d *deployment) start(t *testing.T, user string, args ...string) *proc {
	t.Helper()
	return startEnv(t, t.TempDir(), d.env(user), d.args(user, args...)...)
}

// run runs a bgtask command as user to its end.
func (d *deployment) run(t *testing.T, user string, args ...string) result {
	t.Helper()
	return d.runEnv(t, user, nil, args...)
}

// runEnv is run with more environment variables, which override the deployment's.
func (d *deployment) runEnv(t *testing.T, user string, env []string, args ...string) result {
	t.Helper()
	return runBin(t, 90*time.Second, append(append(childEnv(t.TempDir()), d.env(user)...), env...), d.args(user, args...)...)
}

// ok runs a command as user that must succeed and returns its stdout.
func (d *deployment) ok(t *testing.T, user string, args ...string) string {
	t.Helper()
	r := d.run(t, user, args...)
	if r.code != 0 {
		t.Fatalf("bgtask %s (as %s): exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), user, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// connect opens a NATS connection as user, for what the test reads and checks itself.
func (d *deployment) connect(t *testing.T, user string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts = append([]nats.Option{nats.UserInfo(user, d.passwords[user]), nats.MaxReconnects(-1)}, opts...)
	nc, err := nats.Connect(d.cluster.URLs(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// workersReady waits until `bgtask workers` lists n ready workers. On a busy
// machine a cluster takes a while to create its R3 streams.
func (d *deployment) workersReady(t *testing.T, n int) {
	t.Helper()
	testkit.Eventually(t, 3*time.Minute, "workers ready", func() bool {
		r := d.run(t, "client", "workers", "--json")
		if r.code != 0 {
			return false
		}
		return strings.Count(r.stdout, `"state": "ready"`) == n
	})
}
