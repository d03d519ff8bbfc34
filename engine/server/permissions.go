package server

import (
	"slices"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/bgtask/bgtask/client"
	"github.com/bgtask/bgtask/engine/api"
	"github.com/bgtask/bgtask/events"
)

// The embedded server's users and what each may do. They follow the identities of
// deploy/nats/accounts.conf, with two differences that come from one user on one
// machine: the client reads and acknowledges the inbox of every target (the CLI
// serves any --target) and may drain a worker (`bgtask worker drain`), which on a
// cluster is the operator's engine identity.
//
//   - engine: everything; generated at each start, in memory only.
//   - worker: the events of a run and nothing that decides an outcome.
//   - client: the API, reads, its inbox and target states; no write into a stream
//     bgtask decides from.
var (
	// readStreams is the JetStream API a reader of the streams needs: stream
	// info, direct and stored gets, and consumers of its own (wait, logs --follow,
	// history, audit, inbox), which it deletes when it is done.
	readStreams = []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO.>",
		"$JS.API.STREAM.NAMES",
		"$JS.API.STREAM.LIST",
		"$JS.API.STREAM.MSG.GET.>",
		"$JS.API.DIRECT.GET.>",
		"$JS.API.CONSUMER.CREATE.>",
		"$JS.API.CONSUMER.MSG.NEXT.>",
		"$JS.API.CONSUMER.INFO.>",
		"$JS.API.CONSUMER.NAMES.>",
		"$JS.API.CONSUMER.LIST.>",
		"$JS.API.CONSUMER.DELETE.>",
		"_INBOX.>",
	}

	// neverWrite is denied to workers and clients, explicitly, so that a wider
	// allow added later does not hand it out: the streams' configurations (a
	// stream of one's own could republish into the event stream), and the removal
	// of what bgtask decides from.
	neverWrite = []string{
		"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
		"$JS.API.STREAM.MSG.DELETE.>",
		"$JS.API.STREAM.PURGE." + events.StreamName, "$JS.API.STREAM.PURGE." + events.InboxStreamName,
		"$JS.API.STREAM.PURGE." + events.ArchiveStreamName,
	}

	// outcomeEvents are the events that decide what a task became and whether
	// its caller is woken: the engine's alone.
	outcomeEvents = []string{
		events.TaskSubject("*", events.TypeArmed),
		events.TaskSubject("*", events.TypeCompletionPersisted),
		events.TaskSubject("*", events.TypeFired),
		events.TaskSubject("*", events.TypeCancelled),
		events.TaskSubject("*", events.TypeDue),
		events.TaskSubject("*", events.TypeRetryScheduled),
		events.TaskSubject("*", events.TypeProbeScheduled),
		events.TaskSubject("*", events.TypePaused),
		events.TaskSubject("*", events.TypeResumed),
		events.TaskSubject("*", events.TypeCompleted),
		events.TaskSubject("*", events.TypeSkipped),
		events.TaskSubject("*", events.TypeJoined),
		events.TaskSubject("*", events.TypeConsumed),
		events.TaskSubject("*", events.TypeRedeliveryRequested),
	}

	workerPermissions = &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{
			Allow: append([]string{
				events.TaskSubject("*", events.TypeSpawned),
				events.TaskSubject("*", events.TypeTick),
				events.TaskSubject("*", events.TypeStalled),
				events.TaskSubject("*", events.TypeExited),
				events.TaskSubject("*", events.TypeNotice),
				events.TaskSubject("*", events.TypeFailed),
				events.TaskSubject("*", events.TypeLost),
				events.LogPrefix + ".>",
				// A flood's log keeps its head and its tail: the worker drops the middle.
				"$JS.API.STREAM.PURGE." + events.LogStreamName,
				"$KV." + events.WorkersBucket + ".*",
			}, readStreams...),
			Deny: slices.Concat([]string{
				api.SubjectRegister, api.SubjectRerun, events.InboxPrefix + ".>", events.ArchiveSubject,
			}, outcomeEvents, neverWrite),
		},
		Subscribe: &natsserver.SubjectPermission{
			Allow: []string{
				events.WorkerPrefix + ".*.>",
				events.SubjectPrefix + ".>",
				events.LogPrefix + ".>",
				"_INBOX.>",
			},
		},
	}

	clientPermissions = &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{
			Allow: append([]string{
				api.SubjectRegister, api.SubjectRerun, api.SubjectCancel, api.SubjectGet, api.SubjectList,
				api.SubjectHistory, api.SubjectWorkers, api.SubjectPause, api.SubjectResume, api.SubjectComplete,
				api.SubjectConsume, api.SubjectRedeliver, client.ConsumingPrefix + ".*",
				api.SubjectScheduleAdd, api.SubjectScheduleList, api.SubjectScheduleShow, api.SubjectSchedulePause,
				api.SubjectScheduleResume, api.SubjectScheduleDelete, api.SubjectScheduleTrigger,
				events.WorkerSubject("*", events.VerbDrain),
				"$SRV.>", // the micro service's discovery: nats micro ls, info, stats
				// Acknowledging the inbox (`inbox`), and a target's state (`target busy|idle`).
				"$JS.ACK." + events.InboxStreamName + ".>",
				"$KV." + events.TargetsBucket + ".*",
			}, readStreams...),
			Deny: slices.Concat([]string{
				events.SubjectPrefix + ".>", events.InboxPrefix + ".>", events.LogPrefix + ".>",
				events.ArchiveSubject, events.WorkerSubject("*", events.VerbOffer), "$KV." + events.WorkersBucket + ".>",
				"$JS.API.STREAM.PURGE.>",
			}, neverWrite),
		},
		Subscribe: &natsserver.SubjectPermission{
			Allow: []string{
				events.SubjectPrefix + ".>", events.InboxPrefix + ".>", events.LogPrefix + ".>",
				client.ConsumingPrefix + ".*", "_INBOX.>",
			},
		},
	}
)
