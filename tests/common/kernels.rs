//! The hand-written PTX kernel the GPU tests launch (no nvcc on the build machine).

/// `sum_repeat(data, n, iters, out)`: one block; each thread walks `data[0..n)` (u32)
/// with a block-stride loop, `iters` times, summing (wrapping) into a register, then
/// adds its sum to `*out`. Every parameter is 64-bit. Written by hand (no nvcc here):
/// PTX ISA 7.0 for sm_52, which the driver JIT-compiles for the device. The loads are
/// volatile so that the JIT cannot hoist them out of the outer loop: the kernel
/// really reads the range for its whole run.
pub const PTX: &str = r#".version 7.0
.target sm_52
.address_size 64

.visible .entry sum_repeat(
    .param .u64 data,
    .param .u64 n,
    .param .u64 iters,
    .param .u64 out
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<12>;

    ld.param.u64 %rd1, [data];
    ld.param.u64 %rd2, [n];
    ld.param.u64 %rd3, [iters];
    ld.param.u64 %rd4, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd4, %rd4;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ntid.x;
    cvt.u64.u32 %rd5, %r1;
    cvt.u64.u32 %rd6, %r2;
    mov.u32 %r3, 0;
    mov.u64 %rd7, 0;
$L_outer:
    setp.ge.u64 %p1, %rd7, %rd3;
    @%p1 bra $L_done;
    mov.u64 %rd8, %rd5;
$L_inner:
    setp.ge.u64 %p2, %rd8, %rd2;
    @%p2 bra $L_next;
    shl.b64 %rd9, %rd8, 2;
    add.u64 %rd10, %rd1, %rd9;
    ld.volatile.global.u32 %r4, [%rd10];
    add.u32 %r3, %r3, %r4;
    add.u64 %rd8, %rd8, %rd6;
    bra $L_inner;
$L_next:
    add.u64 %rd7, %rd7, 1;
    bra $L_outer;
$L_done:
    atom.global.add.u32 %r5, [%rd4], %r3;
    ret;
}
"#;

/// Threads per block the tests launch `sum_repeat` with.
pub const THREADS: u32 = 1024;
