// Package volumes is the frontend.Opener over basalt volumes: it adapts the
// client library (pkg/client) to the protocol-neutral access layer and knows no
// protocol.
//
//   - Open opens a volume with a read-only session (epoch 0): attaching to an
//     export and reading it never disturbs the volume's writer. The backend
//     takes the writer role on its first write, trim or write-zeroes: it opens a
//     writer session (a new epoch, which fences any other writer), holding the
//     mutations (and flushes behind them) that arrive meanwhile, and from then
//     on sends every IO there. A read-only Config never does. If taking the role
//     fails, the IO that waited fails and the next mutation tries again. A
//     backend whose read-only session stopped, or whose volume was deleted
//     (sessions are opened by name, and a volume with only read-only sessions
//     can be deleted and created anew), never takes the role: it checks the
//     volume's id before and after opening the writer session.
//   - Stat and List answer from the MDS's metadata, with no session.
//   - Check reports a session that stopped for good (fenced, lease lapsed) or
//     a deleted volume, so the access layer opens the export again for a new
//     attachment, and otherwise re-reads the volume's size
//     (client.Volume.Refresh), so a resize reaches an open export.
//   - Classify maps the client's errors to the frontend error classes:
//     FENCED and an expired lease → ErrFenced, READ_ONLY → ErrReadOnly,
//     NO_SPACE → ErrNoSpace, OUT_OF_RANGE → ErrOutOfRange, BAD_REQUEST →
//     ErrInvalid, client timeouts, missing routes and an MDS that does not
//     answer → ErrUnavailable, a closed volume → ErrShuttingDown, the rest →
//     ErrIO.
//
// Every volume's client shares the Opener's MDS connection, its metrics and,
// inside a chunkserver, the local fast path (client.Config.Local).
//
// Goroutines: a short-lived claim goroutine per backend while it takes the
// writer role; everything else is the client library's.
package volumes
