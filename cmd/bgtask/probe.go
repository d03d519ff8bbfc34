package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/bgtask/bgtask/events"
	"github.com/bgtask/bgtask/internal/secretenv"
)

// probeOptions name the identity clients use, so the engine can check that it
// cannot write events.
type probeOptions struct {
	user, creds, nkey string
}

func (p *probeOptions) register(f *pflag.FlagSet) {
	f.StringVar(&p.user, "client-user", "", "with --nats: the NATS user clients register tasks as (password in $BGTASK_CLIENT_PASSWORD); the server refuses to run if it can publish events")
	f.StringVar(&p.creds, "client-creds", "", "with --nats: the credentials file of the client identity, checked like --client-user")
	f.StringVar(&p.nkey, "client-nkey", "", "with --nats: the nkey seed file of the client identity, checked like --client-user")
}

// errWritableEvents is the refusal to run on a deployment where a client could
// append events directly, around every check of the engine: such a client can arm
// any command on every worker, or forge a completion.
var errWritableEvents = errors.New("refusing to run")

// check probes, as an anonymous connection and as the client identity, whether a
// publish into the event stream would reach it. A warning would not do: on such a
// deployment anyone who can reach NATS runs commands on the workers, and a log line
// is read after the harm. So the server fails closed, before it serves anything.
func (p *probeOptions) check(ctx context.Context, g *globals, logger *slog.Logger) error {
	base, err := g.auth.tlsOptions()
	if err != nil {
		return err
	}
	type identity struct {
		name string
		opts []nats.Option
	}
	ids := []identity{{name: "an anonymous connection", opts: base}}
	given := 0
	if p.user != "" {
		given++
		password := os.Getenv("BGTASK_CLIENT_PASSWORD")
		secretenv.Hold(password)
		ids = append(ids, identity{"client user " + p.user, slices.Concat(base, []nats.Option{nats.UserInfo(p.user, password)})})
	}
	if p.creds != "" {
		given++
		if err := holdCredsSeed(p.creds); err != nil {
			return err
		}
		ids = append(ids, identity{"client credentials " + p.creds, slices.Concat(base, []nats.Option{nats.UserCredentials(p.creds)})})
	}
	if p.nkey != "" {
		given++
		opt, err := nkeyOption(p.nkey)
		if err != nil {
			return err
		}
		ids = append(ids, identity{"client nkey " + p.nkey, slices.Concat(base, []nats.Option{opt})})
	}
	if given > 1 {
		return usageErr("--client-user, --client-creds and --client-nkey: give one client identity")
	}
	for i, id := range ids {
		writable, err := probeEventWrite(ctx, g.natsURL, id.opts)
		switch {
		case i == 0 && errors.Is(err, nats.ErrAuthorization):
			continue // the server lets no one in without credentials
		case err != nil:
			return fmt.Errorf("check %s: %w", id.name, err)
		case writable:
			return fmt.Errorf("%w: %s can publish into the event stream %s (%s.>), so it could arm commands or forge outcomes; deny it those subjects (see deploy/nats/ and docs/operations.md, Security)",
				errWritableEvents, id.name, events.StreamName, events.SubjectPrefix)
		}
	}
	if given == 0 {
		logger.Warn("the client identity was not checked: give --client-user, --client-creds or --client-nkey so the server can refuse a deployment where clients could write events")
	} else {
		logger.Info("checked: the client identity cannot publish events")
	}
	return nil
}

// probeEventWrite reports whether a connection with opts may publish into the
// event stream. The probe expects a stream that does not exist, so the event
// stream rejects it and nothing is ever stored: an answer (or "no responders",
// before the stream exists) means the publish got through; a permissions
// violation means it did not.
func probeEventWrite(ctx context.Context, url string, opts []nats.Option) (bool, error) {
	denied := make(chan struct{}, 1)
	subject := events.TaskSubject("probe-"+uuid.NewString(), events.TypeArmed)
	opts = append(opts, nats.Name("bgtask-permission-probe"), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				select {
				case denied <- struct{}{}:
				default:
				}
			}
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return false, err
	}
	defer nc.Close()
	msg := nats.NewMsg(subject)
	msg.Header.Set("Nats-Expected-Stream", "BGTASK_PERMISSION_PROBE")
	msg.Data = []byte(`{}`)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	replied := make(chan error, 1)
	go func() {
		_, err := nc.RequestMsgWithContext(ctx, msg)
		replied <- err
	}()
	select {
	case <-denied:
		cancel()
		<-replied
		return false, nil
	case err := <-replied:
		if err == nil || errors.Is(err, nats.ErrNoResponders) {
			return true, nil
		}
		select {
		case <-denied: // the violation came with the timeout
			return false, nil
		default:
		}
		return false, fmt.Errorf("no answer to a probe publish: %w", err)
	}
}
