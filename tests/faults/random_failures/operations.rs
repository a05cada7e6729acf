//! The random sequences of the fault-injection property test: the operations (pool
//! calls, stream work, captures, tags, and driver failures injected into every kind of
//! call) and the pool's setting for one case, with their strategies.

use crate::common;

use common::{GIB, MIB};
use flare_package::driver::sim::SimStreamCall;
use flare_package::{CrossStreamReuse, CuResult, DriverCall, ReusePolicy};
use proptest::prelude::*;

/// One step of a sequence. Kept small so that a shrunk failing case reads as a
/// short script.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// Allocate this many bytes (1 B to 6 GiB).
    Alloc(u64),
    /// Free the live allocation at this index (modulo the number live).
    Free(usize),
    Begin,
    Finish,
    Abort,
    Trim,
    Snapshot,
    /// Make the `nth` next call of this kind fail with this code.
    Fail(DriverCall, u32, CuResult),
    /// Allocate this many bytes on stream `0` (modulo 4: three created streams and
    /// the legacy stream).
    AllocAsync(u8, u64),
    /// Free the live allocation at this index on its stream, if it was made on one.
    FreeAsync(usize),
    /// Launch a kernel touching the live stream allocation at this index on stream
    /// `1` (modulo 4), after `record_stream` when that is not its own stream.
    Launch(usize, u8),
    /// The device finishes the work queued on this stream so far.
    Complete(u8),
    /// Begin a capture on this created stream (modulo 3), or end the open one.
    Capture(u8),
    /// Make the `nth` next stream or event call of this kind fail with this code.
    FailStream(SimStreamCall, u32, CuResult),
    /// `allocate_tagged_raw` for tag 1 + n % 2 (issue 15): synchronous, or with bit
    /// 2 of n set, stream-ordered on stream (n >> 3) % 4 (in segment mode, a block of
    /// the tag's heap either way).
    AllocTagged(u8, u64),
    /// Free the n-th tagged allocation: on its stream when it was allocated on one.
    FreeTagged(usize),
    /// Sleep tag n % 3 (0: the untagged allocations, in every policy, segment mode
    /// included), offloading or discarding.
    Sleep(u8, bool),
    /// Wake tag n % 3.
    Wake(u8),
}

/// The pool's setting for one case.
#[derive(Clone, Debug)]
pub(crate) struct Setup {
    pub(crate) policy: ReusePolicy,
    pub(crate) release_threshold: u64,
    /// 24 GiB: real out-of-memory happens; 1 PiB: only injected ones.
    pub(crate) small_device: bool,
    /// Grant access to a peer device too (two devices per set-access).
    pub(crate) peer: bool,
    pub(crate) cross: CrossStreamReuse,
    /// Segment mode: requests above this take whole mappings.
    pub(crate) whole_threshold: u64,
}

pub(crate) fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=8 * MIB,
        3 => 1u64..=256 * MIB,
        2 => 1u64..=6 * GIB,
    ]
}

pub(crate) fn failure() -> impl Strategy<Value = Op> {
    use CuResult as C;
    use DriverCall as D;
    let kinds = prop_oneof![
        Just((D::Create, C::OUT_OF_MEMORY)),
        Just((D::Reserve, C::OUT_OF_MEMORY)),
        Just((D::Reserve, C::INVALID_VALUE)),
        Just((D::Map, C::NOT_SUPPORTED)),
        Just((D::Map, C::INVALID_VALUE)),
        Just((D::SetAccess, C::INVALID_VALUE)),
        Just((D::Unmap, C::INVALID_VALUE)),
        Just((D::Release, C::INVALID_VALUE)),
        Just((D::FreeReservation, C::INVALID_VALUE)),
        Just((D::Synchronize, C::STREAM_CAPTURE_UNSUPPORTED)),
        Just((D::Synchronize, C::ILLEGAL_ADDRESS)),
        Just((D::HostAlloc, C::OUT_OF_MEMORY)),
        Just((D::MemcpyDtoH, C::INVALID_VALUE)),
        Just((D::MemcpyHtoD, C::INVALID_VALUE)),
    ];
    (kinds, 1u32..=3).prop_map(|((call, code), nth)| Op::Fail(call, nth, code))
}

fn stream_failure() -> impl Strategy<Value = Op> {
    use SimStreamCall as S;
    let kinds = prop_oneof![
        Just(S::EventRecord),
        Just(S::EventQuery),
        Just(S::EventSynchronize),
        Just(S::EventCreate),
        Just(S::StreamWaitEvent),
        Just(S::StreamGetCaptureInfo),
    ];
    (kinds, 1u32..=3).prop_map(|(call, nth)| Op::FailStream(call, nth, CuResult::UNKNOWN))
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => size().prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        6 => (any::<u8>(), size()).prop_map(|(s, b)| Op::AllocAsync(s, b)),
        5 => any::<usize>().prop_map(Op::FreeAsync),
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, s)| Op::Launch(i, s)),
        3 => any::<u8>().prop_map(Op::Complete),
        2 => any::<u8>().prop_map(Op::Capture),
        2 => stream_failure(),
        2 => Just(Op::Begin),
        2 => Just(Op::Finish),
        1 => Just(Op::Abort),
        1 => Just(Op::Trim),
        1 => Just(Op::Snapshot),
        3 => (any::<u8>(), size()).prop_map(|(t, b)| Op::AllocTagged(t, b)),
        2 => any::<usize>().prop_map(Op::FreeTagged),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(t, o)| Op::Sleep(t, o)),
        1 => any::<u8>().prop_map(Op::Wake),
        6 => failure(),
    ]
}

pub(crate) fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            1 => Just(ReusePolicy::BestFit),
            1 => Just(ReusePolicy::Exact),
            1 => Just(ReusePolicy::None),
            2 => Just(ReusePolicy::Segments)
        ],
        prop_oneof![Just(0u64), Just(64 * MIB), Just(u64::MAX)],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just(CrossStreamReuse::WhenComplete),
            Just(CrossStreamReuse::Never),
            Just(CrossStreamReuse::Wait)
        ],
        prop_oneof![Just(u64::MAX), Just(64 * MIB)],
    )
        .prop_map(
            |(policy, release_threshold, small_device, peer, cross, whole_threshold)| Setup {
                policy,
                release_threshold,
                small_device,
                peer,
                cross,
                whole_threshold,
            },
        )
}
