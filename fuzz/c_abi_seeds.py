#!/usr/bin/env python3
"""Writes the c_abi target's seeds (fuzz/seeds/c_abi/): call sequences in the byte
encoding fuzz_targets/c_abi.rs reads (one op byte, then each argument's bytes,
little-endian), so that fuzzing starts from pools that are created, allocate, free,
sleep and capture. Run it again after changing that encoding:
    python3 fuzz/c_abi_seeds.py
"""
import os
import struct

OPS = dict(create=0, destroy=1, destroy_report=2, allocate=3, allocate_async=4,
           allocate_tagged=5, free=6, free_async=7, record_stream=8, begin=9,
           finish=10, abort=11, trim=12, record_flush=13, record_error=14,
           snapshot=15, census=16, sleep=17, wake=18, inject=19, stream_create=20,
           launch=21, stream_complete=22, begin_capture=23, end_capture=24,
           faults=25, last_error=26)
CONFIG_FIELDS = dict(struct_size=0, backend=1, device=2, reuse_policy=3,
                     release_threshold=4, peers=5, capacity=6, granularity=7,
                     device_count=8, waste=9, cross_stream=10, whole_threshold=11,
                     thread_cache=12, record_path=13)
u8 = lambda v: struct.pack('<B', v)
u16 = lambda v: struct.pack('<H', v)
u32 = lambda v: struct.pack('<I', v)
u64 = lambda v: struct.pack('<Q', v)
VALID = u8(2)      # Out::pick: a valid output
POOL = [u8(0), u8(1)]
SIZEOF_CONFIG = 104


def create(slot=0, patches=(), init=SIZEOF_CONFIG):
    b = u8(OPS['create']) + u8(slot) + u16(init) + u8(2) + u8(0) + u8(len(patches))
    for field, value, extra in patches:
        b += u64(value) + u8(CONFIG_FIELDS[field]) + extra
    return b + VALID + u8(1)


def size(n):
    return u8(3) + u64(n)


def stream(sel, i=0):
    """sel 0: NULL, 2: one of this pool's, 6: the other pool's."""
    return u8(sel) + u8(i)


def ptr(sel, i=0, extra=b''):
    """sel 0: NULL, 1: live, 4: the other pool's, 5: interior, 6: freed, 7: any."""
    return u8(sel) + u16(i) + extra


def op(name, pool=0, *args):
    return u8(OPS[name]) + POOL[pool] + b''.join(args)


def tag(t):
    return u8(t) if t < 3 else u8(7) + u32(t)


basic = (create()
         + op('allocate', 0, size(1 << 20), stream(0), VALID)
         + op('snapshot', 0, u8(0), VALID)
         + op('stream_create', 0, VALID)
         + op('allocate_async', 0, size(3 << 20), stream(2), VALID)
         + op('allocate_tagged', 0, size(5000), stream(2), tag(1), VALID)
         + op('census', 0, tag(1), u8(0), u8(1))
         + op('sleep', 0, tag(1), u32(1))
         + op('free', 0, ptr(1, 2))
         + op('snapshot', 0, u8(0), VALID)
         + op('wake', 0, tag(1))
         + op('free_async', 0, ptr(1, 1), stream(2))
         + op('begin', 0)
         + op('allocate', 0, size(2 << 20), stream(0), VALID)
         + op('free', 0, ptr(1, 0))
         + op('free', 0, ptr(6, 0))
         + op('finish', 0)
         + op('trim', 0)
         + op('destroy_report', 0, u8(0), u8(1)))

segments = (create(patches=[('reuse_policy', 3, b''), ('thread_cache', 0xFFFFFFFF, u64(0))])
            + b''.join(op('allocate', 0, size(s), stream(0), VALID)
                       for s in (512, 1000, 4096, 1 << 20, (1 << 20) + 1, 3 << 20))
            + op('free', 0, ptr(5, 1, u32(100)))
            + op('free', 0, ptr(1, 1)) + op('free', 0, ptr(1, 3))
            + op('snapshot', 0, u8(0), VALID)
            + op('allocate', 0, size(700), stream(0), VALID)
            + op('trim', 0))

two_pools = (create(0) + create(1, patches=[('granularity', 1 << 16, b''), ('capacity', 64 << 20, b'')])
             + op('stream_create', 0, VALID) + op('stream_create', 1, VALID)
             + op('allocate_async', 0, size(4096), stream(2), VALID)
             + op('allocate_async', 1, size(4096), stream(6), VALID)
             + op('allocate', 1, size(60 << 20), stream(0), VALID)
             + op('allocate', 1, size(60 << 20), stream(0), VALID)
             + op('free', 1, ptr(4, 0))
             + op('record_stream', 0, ptr(1, 0), stream(6))
             + op('free_async', 0, ptr(1, 0), stream(2))
             + op('destroy', 0)
             + op('snapshot', 1, u8(0), VALID))

captures = (create(patches=[('cross_stream', 2, b'')])
            + op('stream_create', 0, VALID) + op('stream_create', 0, VALID)
            + op('begin', 0)
            + op('begin_capture', 0, stream(2, 0))
            + op('allocate_async', 0, size(8 << 20), stream(2, 0), VALID)
            + op('launch', 0, stream(2, 0), ptr(1, 0), size(4096))
            + op('free_async', 0, ptr(1, 0), stream(2, 0))
            + op('allocate_async', 0, size(8 << 20), stream(2, 0), VALID)
            + op('end_capture', 0, stream(2, 0), VALID)
            + op('stream_complete', 0, stream(2, 1))
            + op('faults', 0, VALID)
            + op('abort', 0))

bad_config = (create(patches=[('struct_size', 0, u8(3) + u32(7))])
              + create(patches=[('peers', 2, u16(3))])
              + create(patches=[('peers', 1, u16(4000))])
              + create(patches=[('record_path', 2, b'')])
              + create(patches=[('backend', 9, b''), ('reuse_policy', 4, b'')])
              + create(patches=[('granularity', 3, b'')])
              + create(patches=[('struct_size', 0, u8(2) + u16(60))])
              + op('last_error', 0, u8(40), u32(9)))

injected = (create()
            + op('inject', 0, u32(0), u8(1), u16(2))
            + op('allocate', 0, size(1 << 20), stream(0), VALID)
            + op('inject', 0, u32(3), u8(1), u16(999))
            + op('allocate', 0, size(1 << 20), stream(0), VALID)
            + op('free', 0, ptr(1, 0))
            + op('allocate', 0, size(1 << 62), stream(0), VALID)
            + op('allocate', 0, size(0), stream(0), VALID)
            + op('snapshot', 0, u8(2) + u16(300), VALID))

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'seeds', 'c_abi')
os.makedirs(out, exist_ok=True)
for name, seed in dict(basic=basic, segments=segments, two_pools=two_pools,
                       captures=captures, bad_config=bad_config,
                       injected=injected).items():
    with open(os.path.join(out, name + '.bin'), 'wb') as f:
        f.write(seed)
