//! The events of a trace ([`Event`]), one per line, and the limits of their fields.

use std::fmt;

/// Largest allocation size a trace may name, bytes (2^63).
pub const MAX_ALLOCATION_BYTES: u64 = 1 << 63;
/// The largest count of an `oom N` line: the out-of-memory answers one allocation
/// of a pool gets from the driver, its create and (outside a retention scope, after
/// releasing idle memory) one retry (`Pool::allocate_raw`). An allocation that
/// succeeded got one at most: a second answer fails it (an `x` line).
pub const MAX_OOM_ANSWERS: u64 = 2;

/// One event of a trace. Allocation ids are dense indices `0..Trace::id_count()`,
/// one per distinct id token of the file (an id reused after its free keeps its
/// index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// `a ID BYTES`: allocate `bytes` bytes (`1..=2^63`) as allocation `id`.
    Alloc {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
    },
    /// `a ID BYTES TAG` with a tag other than 0: allocate `bytes` bytes as
    /// allocation `id` for tag `tag` (`Pool::allocate_tagged_raw`; issue 15). `a ID
    /// BYTES 0` is an [`Event::Alloc`].
    AllocTagged {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 1 to 2^32 - 1.
        tag: u32,
    },
    /// `a ID BYTES TAG STREAM`: allocate `bytes` bytes as allocation `id` for tag
    /// `tag` (0: untagged), stream-ordered on stream `stream`
    /// (`Pool::allocate_async_raw`, or `Pool::allocate_tagged_raw` with the stream;
    /// a recorded trace, `docs/trace-format.md`).
    AllocAsync {
        /// Dense index of the allocation's id.
        id: u32,
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 0 to 2^32 - 1.
        tag: u32,
        /// Dense index of the stream's name ([`Trace::stream_name`]).
        ///
        /// [`Trace::stream_name`]: super::Trace::stream_name
        stream: u32,
    },
    /// `f ID`: free the live allocation `id`.
    Free {
        /// Dense index of the allocation's id.
        id: u32,
    },
    /// `f ID STREAM`: free the live allocation `id` on stream `stream`
    /// (`Pool::free_async_raw`).
    FreeAsync {
        /// Dense index of the allocation's id.
        id: u32,
        /// Dense index of the stream's name.
        stream: u32,
    },
    /// `r ID STREAM`: the live allocation `id` is used on stream `stream` too
    /// (`Pool::record_stream`).
    RecordStream {
        /// Dense index of the allocation's id.
        id: u32,
        /// Dense index of the stream's name.
        stream: u32,
    },
    /// `done STREAM MARK`: the recorded pool saw the work of stream `stream` complete
    /// through its `mark`-th stream-ordered free (counted as the replay counts them:
    /// `docs/trace-format.md`, "Recorded traces").
    Done {
        /// Dense index of the stream's name.
        stream: u32,
        /// The mark, 1 or more.
        mark: u64,
    },
    /// `forget STREAM`: the recorded pool was told that stream `stream` is about to be
    /// destroyed (`Pool::forget_stream`); from the next line on its name names a new
    /// stream (a new dense index: the driver may hand the handle out again).
    Forget {
        /// Dense index of the stream's name, before the line.
        stream: u32,
    },
    /// `oom N` (N from 1 to [`MAX_OOM_ANSWERS`]; 1 before an `a` line, and before an
    /// `x` inside a retention scope): during the next allocation, the recorded pool's driver answered
    /// out-of-memory `count` times (the replay makes its next `count` handle
    /// creations fail so).
    Oom {
        /// How many times, 1 or more.
        count: u32,
    },
    /// `x BYTES [TAG [STREAM]]`: an allocation of `bytes` bytes (for `tag`, on
    /// `stream` when given) that the recorded pool refused with out-of-memory, after
    /// releasing idle memory to retry (a recorded trace: the replay makes the same
    /// request; it allocates nothing when it fails as recorded).
    AllocFailed {
        /// Requested size, bytes (not rounded).
        bytes: u64,
        /// The tag, 0 to 2^32 - 1.
        tag: u32,
        /// Dense index of the stream's name, for a stream-ordered request.
        stream: Option<u32>,
    },
    /// `sleep TAG offload|discard`: the recorded pool put tag `tag` to sleep
    /// (`Pool::sleep`; a recorded trace).
    Sleep {
        /// The tag.
        tag: u32,
        /// Whether its contents were copied to host memory (`offload`).
        offload: bool,
    },
    /// `wake TAG`: the recorded pool woke tag `tag` (`Pool::wake`).
    Wake {
        /// The tag.
        tag: u32,
    },
    /// `begin`: open a retention scope.
    Begin,
    /// `finish`: close the retention scope; retained memory is released.
    Finish,
    /// `abort`: close the retention scope as failed; retained memory is released.
    Abort,
    /// `trim`: release idle cached memory now (outside a scope).
    Trim,
    /// `step`: a step marker (`Pool::mark_step`): the allocations after it belong
    /// to the next step of the growth report (`crate::growth`).
    Step,
}

impl fmt::Display for Event {
    /// Writes the event as a trace line would, with its dense id index
    /// (`a 3 2097152`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Alloc { id, bytes } => write!(f, "a {id} {bytes}"),
            Event::AllocTagged { id, bytes, tag } => write!(f, "a {id} {bytes} {tag}"),
            Event::AllocAsync {
                id,
                bytes,
                tag,
                stream,
            } => write!(f, "a {id} {bytes} {tag} s{stream}"),
            Event::Free { id } => write!(f, "f {id}"),
            Event::FreeAsync { id, stream } => write!(f, "f {id} s{stream}"),
            Event::RecordStream { id, stream } => write!(f, "r {id} s{stream}"),
            Event::Done { stream, mark } => write!(f, "done s{stream} {mark}"),
            Event::Forget { stream } => write!(f, "forget s{stream}"),
            Event::Oom { count } => write!(f, "oom {count}"),
            Event::Sleep { tag, offload } => {
                write!(
                    f,
                    "sleep {tag} {}",
                    if *offload { "offload" } else { "discard" }
                )
            }
            Event::Wake { tag } => write!(f, "wake {tag}"),
            Event::AllocFailed { bytes, tag, stream } => match stream {
                Some(s) => write!(f, "x {bytes} {tag} s{s}"),
                None if *tag != 0 => write!(f, "x {bytes} {tag}"),
                None => write!(f, "x {bytes}"),
            },
            Event::Begin => f.write_str("begin"),
            Event::Finish => f.write_str("finish"),
            Event::Abort => f.write_str("abort"),
            Event::Trim => f.write_str("trim"),
            Event::Step => f.write_str("step"),
        }
    }
}
