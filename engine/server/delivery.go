package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bgtask/bgtask/engine"
	"github.com/bgtask/bgtask/engine/sinks"
	"github.com/bgtask/bgtask/internal/secretenv"
	"github.com/bgtask/bgtask/internal/serverhome"
)

// DeliveryOptions are what the engine pushes wake-ups to sinks with.
type DeliveryOptions struct {
	// SecretFile holds the key that signs webhook bodies; "": the home's
	// serverhome.WebhookSecretFile, generated on first start.
	SecretFile string
	// RetryBase is the wait after a push sink's first failed attempt.
	RetryBase time.Duration
	// Bearers are the bearer tokens webhook sinks may name.
	Bearers engine.WebhookBearers
}

// pushing is what the engine's pusher is made with.
type pushing struct {
	runner    engine.SinkRunner
	retryBase time.Duration
	// bearers are the bearer tokens webhooks may name, which registration checks.
	bearers engine.Bearers
}

// pushing is what the engine pushes with: the delivery options, the bearer
// tokens of the flags and of the home, and the rule of DenyPrivate.
func (o Options) pushing(secret []byte, home string) pushing {
	bearers := engine.Bearers{Flags: o.Delivery.Bearers, Home: homeBearers(home)}
	runner := sinks.New(secret).WithBearers(bearers)
	if o.DenyPrivate {
		runner = runner.DenyPrivate()
	}
	return pushing{runner: runner, retryBase: o.Delivery.RetryBase, bearers: bearers}
}

// homeBearers finds the bearer tokens home declares (serverhome.BearersDir),
// reading the declaration at each use.
func homeBearers(home string) func(name string) (engine.WebhookBearer, bool, error) {
	return func(name string) (engine.WebhookBearer, bool, error) {
		b, err := serverhome.ReadBearer(home, name)
		if errors.Is(err, fs.ErrNotExist) {
			return engine.WebhookBearer{}, false, nil
		}
		if err != nil {
			return engine.WebhookBearer{}, false, pathless(err)
		}
		bearer := engine.WebhookBearer{Name: name, Held: b.Token}
		for _, raw := range b.URLPrefixes {
			p, err := engine.ParseURLPrefix(raw)
			if err != nil {
				return engine.WebhookBearer{}, false, fmt.Errorf("its declaration in the server's home (%s/%s.json) has a bad URL prefix: %v", serverhome.BearersDir, name, err)
			}
			bearer.Prefixes = append(bearer.Prefixes, p)
		}
		return bearer, true, nil
	}
}

// pathless is a file error without its path, which is the operator's, not a
// registrant's.
func pathless(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return fmt.Errorf("its declaration in the server's home cannot be read: %v", pe.Err)
	}
	return err
}

// loadWebhookSecret reads the webhook key from file, or from the home, where it is
// generated (32 random bytes, hex, mode 0600) the first time. It never goes into a
// spec or the stream.
func loadWebhookSecret(file, home string) ([]byte, error) {
	generate := file == ""
	if generate {
		file = filepath.Join(home, serverhome.WebhookSecretFile)
	}
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) && generate {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		data = []byte(hex.EncodeToString(key) + "\n")
		if err := serverhome.WriteFileAtomic(file, data); err != nil {
			return nil, fmt.Errorf("write webhook secret: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("webhook secret: %w", err)
	}
	secret := []byte(strings.TrimSpace(string(data)))
	if len(secret) < 16 {
		return nil, badOption("webhook secret %s: %d bytes is too short to sign with; use at least 16", file, len(secret))
	}
	secretenv.Hold(string(secret))
	return secret, nil
}
