// bgtask: the opencode plugin that `bgtask setup opencode` writes; `--remove` takes it out.
//
// It gives the commands of opencode's shell tool their session's id,
// OPENCODE_SESSION_ID, so that `bgtask add` sends a task's wake-up back to that
// session (target opencode-SESSION_ID); it reports the session's turns to bgtask
// (busy, idle); and it hands the session its wake-ups, each once:
//   - what waited while the session was not open comes with the next message
//     the session gets in an opencode process (`opencode -s ID`, `opencode run
//     -s ID`);
//   - what comes while it is open in a process that goes on after a turn (the
//     TUI, `opencode serve`; not `opencode run`, which ends with its turn) starts
//     a new turn: at once when the session is idle, after its turn when busy.
// A wake-up is taken out of bgtask's inbox only once opencode recorded its
// message. The plugin needs no package: it runs `bgtask hook opencode session
// ID`, one for each session, and talks with it in JSON lines (docs/opencode.md).
import { spawn } from "node:child_process"
import { createInterface } from "node:readline"

// The bgtask command, with its home: set by `bgtask setup opencode`.
const BGTASK = __BGTASK__
// How long the message that opens a session here waits for what is pending.
const FIRST_WAIT_MS = 10_000
// How long opencode may take to record a wake-up's message.
const RECORD_MS = 60_000

export const BgtaskPlugin = async ({ client }) => {
  // `opencode run` ends when its turn does: a turn it started after that would
  // not run, so it only takes what rides along with its message.
  const live = process.argv[2] !== "run"
  const sessions = new Map()

  function open(sid) {
    const s = { sid, busy: true, reported: "", held: null, record: null, first: null }
    const args = [...BGTASK.slice(1), "hook", "opencode", "session", sid]
    if (live) args.push("--live")
    const child = spawn(BGTASK[0], args, { stdio: ["pipe", "pipe", "ignore"] })
    s.child = child
    child.on("error", () => gone(s))
    child.on("exit", () => gone(s))
    child.stdin.on("error", () => {})
    // The helper must not keep opencode from exiting; it ends when its stdin does.
    child.unref()
    for (const stream of [child.stdin, child.stdout]) stream.unref?.()
    createInterface({ input: child.stdout }).on("line", (line) => {
      let m
      try {
        m = JSON.parse(line)
      } catch {
        return
      }
      if (s.first) s.first(m)
      else if (typeof m.offer === "string") offered(s, m.offer)
    })
    sessions.set(sid, s)
    return s
  }

  function gone(s) {
    if (sessions.get(s.sid) === s) sessions.delete(s.sid)
    if (s.first) s.first(null)
    if (s.record) clearTimeout(s.record.timer)
    s.record = null
  }

  function send(s, m) {
    try {
      s.child.stdin.write(JSON.stringify(m) + "\n")
    } catch {}
  }

  // answer tells the helper whether opencode recorded the offered message.
  function answer(s, taken, error) {
    if (!s.record) return
    clearTimeout(s.record.timer)
    s.record = null
    send(s, taken ? { taken: true } : { taken: false, error: String(error) })
  }

  // awaitRecord waits for opencode to record the part of the session's message
  // that carries the offer: its id when the plugin made it, else its text.
  function awaitRecord(s, what) {
    const timer = setTimeout(() => answer(s, false, "opencode did not record the message in time"), RECORD_MS)
    s.record = { ...what, timer }
  }

  // firstLine is the helper's first line (an offer, or none), or null when it
  // does not come in time.
  function firstLine(s) {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        s.first = null
        resolve(null)
      }, FIRST_WAIT_MS)
      s.first = (m) => {
        clearTimeout(timer)
        s.first = null
        resolve(m)
      }
    })
  }

  // A message opens the session here: what is pending rides along with it, as
  // one more part of it.
  async function opened(sid, output) {
    const s = open(sid)
    const m = await firstLine(s)
    if (!m || typeof m.offer !== "string") return
    const last = output.parts[output.parts.length - 1]
    if (!last?.id || !output.message?.id) {
      s.record = { timer: null }
      answer(s, false, "the message has no part to follow")
      return
    }
    // Parts are kept in the order of their ids: this one follows the last.
    const id = last.id + "bgtask"
    output.parts.push({ id, sessionID: sid, messageID: output.message.id, type: "text", text: m.offer })
    awaitRecord(s, { id })
  }

  // A wake-up came while the session is open: a new turn, now or when its turn ends.
  function offered(s, text) {
    if (!live) {
      s.record = { timer: null }
      answer(s, false, "opencode run ends with its turn")
      return
    }
    s.held = text
    if (!s.busy) startTurn(s)
  }

  function startTurn(s) {
    const text = s.held
    s.held = null
    awaitRecord(s, { text })
    client.session
      .promptAsync({ path: { id: s.sid }, body: { parts: [{ type: "text", text }] } })
      .then(
        (r) => r.error && answer(s, false, JSON.stringify(r.error)),
        (e) => answer(s, false, e),
      )
  }

  function status(sid, type) {
    const s = sessions.get(sid)
    if (!s) return
    s.busy = type !== "idle"
    const state = s.busy ? "busy" : "idle"
    if (state !== s.reported) {
      s.reported = state
      send(s, { state })
    }
    if (!s.busy && s.held !== null && !s.record) startTurn(s)
  }

  function recorded(part) {
    const s = sessions.get(part.sessionID)
    const r = s?.record
    if (!r) return
    if ((r.id && part.id === r.id) || (r.text && part.type === "text" && part.text === r.text)) answer(s, true)
  }

  return {
    "shell.env": async (input, output) => {
      if (input.sessionID) output.env.OPENCODE_SESSION_ID = input.sessionID
    },
    "chat.message": async (input, output) => {
      try {
        const s = sessions.get(input.sessionID)
        if (s) s.busy = true
        else await opened(input.sessionID, output)
      } catch {}
    },
    event: async ({ event }) => {
      try {
        const p = event.properties
        if (event.type === "session.status") status(p.sessionID, p.status?.type)
        else if (event.type === "message.part.updated") recorded(p.part)
        else if (event.type === "session.deleted") sessions.get(p.info?.id)?.child.stdin.end()
      } catch {}
    },
  }
}
