package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// An event stream written before one subject per task stored each event on its
// published subject, bgtask.events.<task-id>.<type>, and read a task with the
// filter bgtask.events.<task-id>.>. Such a stream is upgraded when a server opens
// it: its events are copied, in order, with their ids and message ids, into a
// stream of the new layout under the same name. JetStream cannot rename a stream,
// so the copy goes through a second stream, and every step can be run again after
// a crash:
//
//  1. the old stream is sealed: nothing is appended to it from then on;
//  2. its events are copied into upgradeStreamName, which is then marked copied;
//  3. the old stream is deleted;
//  4. a new event stream is made on subjects nobody publishes to, the copy is
//     copied into it and it is switched to the event subjects;
//  5. the copy is deleted.
//
// The events get new sequences (a compacted task's gaps close), and the new stream
// another Identity, so projection snapshots of the old one are not used.
const (
	upgradeStreamName = "BGTASK_EVENTS_UPGRADE"
	upgradeCopyPrefix = "bgtask.upgrade.copy"
	// The new event stream takes its events from the copy on these subjects until
	// it is whole, so that no writer appends to it before.
	upgradeRestorePrefix = "bgtask.upgrade.restore"
	upgradeStateKey      = "bgtask-upgrade"
	upgradeCopied        = "copied"
)

// upgradeStream brings an event stream of the old layout to the new one, or
// finishes an upgrade that stopped, and does nothing to a stream of the new
// layout or none.
func upgradeStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	current, err := findStream(ctx, js, StreamName)
	if err != nil {
		return err
	}
	copied, err := findStream(ctx, js, upgradeStreamName)
	if err != nil {
		return err
	}
	if copied != nil && copied.CachedInfo().Config.Metadata[upgradeStateKey] != upgradeCopied {
		// An upgrade stopped while copying: the old stream is still whole.
		if current == nil {
			return fmt.Errorf("upgrade %s: the stream is gone and its copy %s is not whole; restore %s from a backup", StreamName, upgradeStreamName, StreamName)
		}
		if err := js.DeleteStream(ctx, upgradeStreamName); err != nil {
			return fmt.Errorf("upgrade %s: remove the partial copy %s: %w", StreamName, upgradeStreamName, err)
		}
		copied = nil
	}
	if copied == nil {
		switch {
		case current == nil || isNewLayout(current.CachedInfo().Config):
			return nil
		case isRestoring(current.CachedInfo().Config):
			return fmt.Errorf("upgrade %s: the stream is half made and its copy %s is gone; restore %s from a backup", StreamName, upgradeStreamName, StreamName)
		}
		if err := copyOldLayout(ctx, js, current); err != nil {
			return fmt.Errorf("upgrade %s to one subject per task: %w", StreamName, err)
		}
		if copied, err = findStream(ctx, js, upgradeStreamName); err != nil {
			return err
		}
		current = nil
	}
	if err := restoreFromCopy(ctx, js, current, copied, cfg); err != nil {
		return fmt.Errorf("upgrade %s to one subject per task: %w", StreamName, err)
	}
	return nil
}

func findStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find stream %s: %w", name, err)
	}
	return s, nil
}

func isNewLayout(c jetstream.StreamConfig) bool {
	return slices.Equal(c.Subjects, streamSubjects) && c.SubjectTransform != nil && *c.SubjectTransform == *storedSubject
}

func isRestoring(c jetstream.StreamConfig) bool {
	return slices.Equal(c.Subjects, []string{upgradeRestorePrefix + ".*"})
}

// copyOldLayout seals the old stream, copies it into the upgrade stream, marks the
// copy whole and deletes the old stream (steps 1 to 3).
func copyOldLayout(ctx context.Context, js jetstream.JetStream, old jetstream.Stream) error {
	oldCfg := old.CachedInfo().Config
	// Checked before the seal, which cannot be undone: a subject the copy could
	// not place is for its operator to remove first.
	info, err := old.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		return fmt.Errorf("list the old stream's subjects: %w", err)
	}
	for subject := range info.State.Subjects {
		if _, err := oldTaskSubject(subject); err != nil {
			return fmt.Errorf("%w; remove it (nats stream purge %s --subject %s) and start again", err, StreamName, subject)
		}
	}
	if !oldCfg.Sealed {
		oldCfg.Sealed = true
		if _, err := js.UpdateStream(ctx, oldCfg); err != nil {
			return fmt.Errorf("seal the old stream: %w", err)
		}
	}
	copyCfg := jetstream.StreamConfig{
		Name:        upgradeStreamName,
		Description: "bgtask: the copy of " + StreamName + " while it is upgraded to one subject per task",
		Subjects:    []string{upgradeCopyPrefix + ".*"},
		Storage:     jetstream.FileStorage,
		Replicas:    oldCfg.Replicas,
		Duplicates:  oldCfg.Duplicates,
	}
	dst, err := js.CreateStream(ctx, copyCfg)
	if err != nil {
		return fmt.Errorf("create %s: %w", upgradeStreamName, err)
	}
	if err := copyEvents(ctx, js, old, dst, oldTaskSubject); err != nil {
		return err
	}
	copyCfg.Metadata = map[string]string{upgradeStateKey: upgradeCopied}
	if _, err := js.UpdateStream(ctx, copyCfg); err != nil {
		return fmt.Errorf("mark %s copied: %w", upgradeStreamName, err)
	}
	if err := js.DeleteStream(ctx, StreamName); err != nil {
		return fmt.Errorf("delete the old stream: %w", err)
	}
	return nil
}

// oldTaskSubject places an event of the old layout, bgtask.events.<task-id>.<type>,
// in the copy. The old filter of a task, bgtask.events.<task-id>.>, read any
// subject with more tokens after the id as the task's too.
func oldTaskSubject(subject string) (string, error) {
	tokens := strings.Split(subject, ".")
	if len(tokens) < 4 || strings.Join(tokens[:2], ".") != SubjectPrefix {
		return "", fmt.Errorf("subject %s is of no task", subject)
	}
	return upgradeCopyPrefix + "." + tokens[2], nil
}

// restoreFromCopy makes the new event stream from the copy and deletes the copy
// (steps 4 and 5). current is what is under the event stream's name now: nothing,
// the sealed old stream, a new stream half made, or the finished one.
func restoreFromCopy(ctx context.Context, js jetstream.JetStream, current, copied jetstream.Stream, cfg StreamConfig) error {
	if current == nil || !isNewLayout(current.CachedInfo().Config) {
		if current != nil {
			if err := js.DeleteStream(ctx, StreamName); err != nil {
				return fmt.Errorf("delete what is left of %s: %w", StreamName, err)
			}
		}
		restoring := streamConfig(cfg)
		restoring.Subjects = []string{upgradeRestorePrefix + ".*"}
		restoring.SubjectTransform = &jetstream.SubjectTransformConfig{
			Source:      upgradeRestorePrefix + ".*",
			Destination: SubjectPrefix + ".{{wildcard(1)}}",
		}
		dst, err := js.CreateStream(ctx, restoring)
		if err != nil {
			return fmt.Errorf("create the new %s: %w", StreamName, err)
		}
		// A stream made under the name of one just deleted may start with a message
		// of the deleted one (nats-server v2.15, one run in about fifty of
		// TestAnUpgradeThatStoppedIsFinished): emptied first, it holds the copy alone.
		if err := dst.Purge(ctx); err != nil {
			return fmt.Errorf("empty the new %s: %w", StreamName, err)
		}
		err = copyEvents(ctx, js, copied, dst, func(subject string) (string, error) {
			return upgradeRestorePrefix + strings.TrimPrefix(subject, upgradeCopyPrefix), nil
		})
		if err != nil {
			return err
		}
		if _, err := js.UpdateStream(ctx, streamConfig(cfg)); err != nil {
			return fmt.Errorf("open the new %s to events: %w", StreamName, err)
		}
	}
	if err := js.DeleteStream(ctx, upgradeStreamName); err != nil {
		return fmt.Errorf("delete %s: %w", upgradeStreamName, err)
	}
	return nil
}

// copyWindow is how many copied events may wait for their acknowledgements.
const copyWindow = 1024

// copyEvents publishes every message of src, in order, into dst on the subject
// that subject maps its subject to, with its headers but the expectations its
// first publish was checked against, and then checks that dst holds as many.
func copyEvents(ctx context.Context, js jetstream.JetStream, src, dst jetstream.Stream, subject func(string) (string, error)) error {
	info, err := src.Info(ctx)
	if err != nil {
		return err
	}
	want := info.State.Msgs
	if want > 0 {
		cons, err := src.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return fmt.Errorf("read %s: %w", info.Config.Name, err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(copyWindow))
		if err != nil {
			return fmt.Errorf("read %s: %w", info.Config.Name, err)
		}
		defer it.Stop()
		var pending []jetstream.PubAckFuture
		// The source takes no more events (sealed, or the copy), so its count is
		// where the copy ends.
		for n := uint64(1); n <= want; n++ {
			msg, err := it.Next()
			if err != nil {
				return fmt.Errorf("read %s: %w", info.Config.Name, err)
			}
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			seq := meta.Sequence.Stream
			to, err := subject(msg.Subject())
			if err != nil {
				return fmt.Errorf("%s seq %d: %w", info.Config.Name, seq, err)
			}
			out := &nats.Msg{Subject: to, Data: msg.Data(), Header: nats.Header{}}
			for k, v := range msg.Headers() {
				if !strings.HasPrefix(k, "Nats-Expected-") {
					out.Header[k] = v
				}
			}
			f, err := js.PublishMsgAsync(out, jetstream.WithExpectStream(dst.CachedInfo().Config.Name))
			if err != nil {
				return fmt.Errorf("copy %s seq %d: %w", info.Config.Name, seq, err)
			}
			if pending = append(pending, f); len(pending) == copyWindow || n == want {
				if err := awaitAcks(ctx, pending); err != nil {
					return fmt.Errorf("copy %s: %w", info.Config.Name, err)
				}
				pending = pending[:0]
			}
		}
	}
	got, err := dst.Info(ctx)
	if err != nil {
		return err
	}
	if got.State.Msgs != want {
		return fmt.Errorf("%s holds %d events after the copy of %d from %s: two had one message id", got.Config.Name, got.State.Msgs, want, info.Config.Name)
	}
	return nil
}

func awaitAcks(ctx context.Context, futures []jetstream.PubAckFuture) error {
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				return fmt.Errorf("message id %s twice", f.Msg().Header.Get(jetstream.MsgIDHeader))
			}
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
