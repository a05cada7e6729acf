//! Stream order: `allocate_async`, `free_async` and `record_stream`, the fences that
//! tell when memory freed on a stream may go to another stream or be released, and
//! the release points that wait on them.
//!
//! Memory freed on stream S is indexed in S's bucket with a mark (S's free count):
//! an allocation on S takes it at once (stream order makes that safe). A fence is an
//! event recorded on S after some frees (lazily: one event covers every earlier free
//! on S); when a fence completes, the memory it covers has no queued work left, so it
//! moves to the [`ANY`](super::books::ANY) bucket (or is released, over the release
//! threshold), with no device synchronize. Fences are polled with `cuEventQuery` at
//! release points (a free over the threshold, at most once per `poll_interval` such
//! frees; an allocation that misses) and waited on with `cuEventSynchronize` where memory must
//! be released now (out-of-memory retry, trim, finish, destroy). Every query and wait
//! runs with the calling thread in relaxed capture mode, so that a capture open
//! anywhere in the process stays valid (`docs/vmm-semantics.md`, "Events and stream
//! queries while another stream is captured"); no fence is recorded on the legacy
//! stream (its events break every capture when queried): frees there are fenced on
//! the pool's own blocking stream, which is ordered after the legacy stream's work.
//!
//! During a capture (`cuStreamGetCaptureInfo` on the call's stream) a free never
//! records, queries or synchronizes anything: the memory goes to the capture's
//! bucket, reused only by later allocations in the same capture and kept (a graph
//! may replay into it) until the retention scope open at capture time closes, or,
//! with none open, until trim or destroy. That release synchronizes every device
//! with access first: a graph's replays run on streams the pool never sees, so no
//! fence covers them.

mod allocate;
mod fences;
mod forget;
mod free;
mod release_points;

pub(crate) use forget::check_forgettable;

use fences::{count_stream_failure, Cover};
use release_points::hold_unconfirmed;
