package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/bgtask/bgtask/events"
)

// ProbeOptions say how RunExternal checks, before it serves, that neither an
// anonymous connection nor the identity clients use can write events.
type ProbeOptions struct {
	// TLS are the TLS options of the deployment, which the anonymous probe
	// connects with.
	TLS []nats.Option
	// Client is the identity clients register tasks as (--client-user,
	// --client-creds, --client-nkey); nil: not given, and not checked.
	Client *ClientIdentity
}

// ClientIdentity is an identity clients connect as: named for the messages, and
// the options that connect as it (with the deployment's TLS).
type ClientIdentity struct {
	Name    string
	Options []nats.Option
}

// errWritableEvents is the refusal to run on a deployment where a client could
// append events directly, around every check of the engine: such a client can arm
// any command on every worker, or forge a completion.
var errWritableEvents = errors.New("refusing to run")

// check probes, as an anonymous connection and as the client identity, whether a
// publish into the event stream of url would reach it. A warning would not do: on
// such a deployment anyone who can reach NATS runs commands on the workers, and a
// log line is read after the harm. So the server fails closed, before it serves
// anything.
func (p ProbeOptions) check(ctx context.Context, url string, logger *slog.Logger) error {
	ids := []ClientIdentity{{Name: "an anonymous connection", Options: p.TLS}}
	if p.Client != nil {
		ids = append(ids, ClientIdentity{Name: p.Client.Name, Options: slices.Concat(p.TLS, p.Client.Options)})
	}
	for i, id := range ids {
		writable, err := probeEventWrite(ctx, url, slices.Clone(id.Options))
		switch {
		case i == 0 && errors.Is(err, nats.ErrAuthorization):
			continue // the server lets no one in without credentials
		case err != nil:
			return fmt.Errorf("check %s: %w", id.Name, err)
		case writable:
			return fmt.Errorf("%w: %s can publish into the event stream %s (%s.>), so it could arm commands or forge outcomes; deny it those subjects (see deploy/nats/ and docs/operations.md, Security)",
				errWritableEvents, id.Name, events.StreamName, events.SubjectPrefix)
		}
	}
	if p.Client == nil {
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
