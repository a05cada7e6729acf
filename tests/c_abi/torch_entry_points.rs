//! Issue 16: PyTorch's entry points (`flare_torch_*`, src/ffi/torch.rs) called from
//! Rust as PyTorch calls them, on the simulated backend. The Python package's tests
//! drive them too, but only a Rust test runs when a mutation run mutates them.
//!
//! One test: the entry points share one allocator per process, made by the first
//! call (`flare_torch_use_simulated` must be that call), so this test runs in a
//! process of its own (`crate::common::own_process`) and its steps run in order. Every
//! expected value comes from the entry points' contracts (their doc comments) and the
//! simulated driver's defaults (2 MiB granularity); the segment arithmetic is that of
//! segment mode (a block is its request rounded to 512 bytes, in one 2 MiB handle for
//! small requests).

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::Mutex;

use flare_package::ffi::{
    flare_last_error_message, flare_torch_alloc, flare_torch_begin_allocate_to_pool,
    flare_torch_end_allocate_to_pool, flare_torch_free, flare_torch_hook_failures,
    flare_torch_pool_alloc, flare_torch_pool_free, flare_torch_record_flush,
    flare_torch_record_stream, flare_torch_release_pool, flare_torch_reset,
    flare_torch_retention_begin, flare_torch_retention_finish, flare_torch_set_oom_handler,
    flare_torch_sim_begin_capture, flare_torch_sim_end_capture, flare_torch_sim_faults,
    flare_torch_sim_launch, flare_torch_sim_stream_complete, flare_torch_sim_stream_create,
    flare_torch_stats, flare_torch_trim, flare_torch_use_simulated, FlareStatus, FlareStream,
};

const MIB: u64 = 1 << 20;
/// The simulated device's memory, set by `flare_torch_use_simulated`.
const CAPACITY: u64 = 64 * MIB;

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: `buf` has 1024 writable bytes.
    unsafe { flare_last_error_message(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: flare_last_error_message NUL-terminated it.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `flare_torch_stats(device)`.
fn stats_of(device: i32) -> String {
    let mut buf = vec![0 as c_char; 1 << 16];
    // SAFETY: `buf` has that many writable bytes.
    let n = unsafe { flare_torch_stats(device, buf.as_mut_ptr(), buf.len()) };
    assert!(n > 0 && n < buf.len());
    // SAFETY: NUL-terminated by flare_torch_stats.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// The number after `"name":` in `json`, the first such key after `"from":`
/// (`"tensor"`, `"mempool"`, `"graph_pools"`; `"created"` for the device's own
/// `physical_bytes`, the sum over its pools, which comes right after it).
#[track_caller]
fn number_in(json: &str, from: &str, name: &str) -> u64 {
    let part = &json[json
        .find(&format!("\"{from}\":"))
        .unwrap_or_else(|| panic!("no {from} in {json}"))..];
    let key = format!("\"{name}\":");
    let at = part.find(&key).expect("the counter") + key.len();
    part[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .expect("a number")
}

/// The counter `name` of device 0's tensor pool.
#[track_caller]
fn tensor_counter(name: &str) -> u64 {
    number_in(&stats_of(0), "tensor", name)
}

fn ok(status: FlareStatus) {
    assert_eq!(
        status,
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
}

fn stream_on(device: i32) -> FlareStream {
    let mut s: FlareStream = ptr::null_mut();
    // SAFETY: `s` is writable.
    ok(unsafe { flare_torch_sim_stream_create(device, &mut s) });
    s
}

fn faults(device: i32) -> u64 {
    let mut n = u64::MAX;
    // SAFETY: `n` is writable.
    ok(unsafe { flare_torch_sim_faults(device, &mut n) });
    n
}

/// What the out-of-memory handler was called with: function, file, message.
static OOM_CALLS: Mutex<Vec<(String, String, String)>> = Mutex::new(Vec::new());

/// An out-of-memory handler that records its call and returns (so
/// `flare_torch_alloc` returns NULL after it).
unsafe extern "C-unwind" fn record_oom(
    func: *const c_char,
    file: *const c_char,
    _line: u32,
    msg: *const c_char,
) {
    // SAFETY: flare_torch_alloc passes NUL-terminated strings valid during the call.
    let s = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    OOM_CALLS.lock().unwrap().push((s(func), s(file), s(msg)));
}

#[test]
fn pytorch_entry_points_allocate_free_and_report_failures() {
    crate::common::own_process::run(
        module_path!(),
        "pytorch_entry_points_allocate_free_and_report_failures",
        steps,
    );
}

/// The steps of [`pytorch_entry_points_allocate_free_and_report_failures`], in its own process.
fn steps() {
    // Every pool records (FLARE_TORCH_RECORD, read when the allocator is made).
    let dir = std::env::temp_dir().join(format!("flare-torch-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = dir.join("rec");
    std::env::set_var("FLARE_TORCH_RECORD", &record);
    // Three devices: device 2 exists, device 3 does not.
    assert_eq!(
        flare_torch_use_simulated(CAPACITY, 3),
        FlareStatus::FLARE_STATUS_SUCCESS,
        "{}",
        last_error()
    );
    let stream = stream_on(0);

    // SAFETY (every call below): the simulated backend; `stream` is a live stream of
    // device 0 or NULL; pointers given to free are only compared.
    unsafe {
        // 0 bytes: NULL, no error, no handler, nothing allocated.
        assert!(flare_torch_alloc(0, 0, stream).is_null());

        // 4096 bytes: a block of one small segment (a 2 MiB handle).
        let p = flare_torch_alloc(4096, 0, stream);
        assert!(!p.is_null(), "{}", last_error());
        assert_eq!(
            (
                tensor_counter("block_live_bytes"),
                tensor_counter("physical_bytes")
            ),
            (4096, 2 * MIB)
        );
        // Its free (stream-ordered, on its own stream) makes the block free at once;
        // a successful hook counts no failure.
        flare_torch_free(p, 4096, 0, stream);
        assert_eq!(tensor_counter("block_live_bytes"), 0);
        assert_eq!(flare_torch_hook_failures(), 0, "{}", last_error());
        // NULL: nothing.
        flare_torch_free(ptr::null_mut(), 0, 0, stream);
        assert_eq!(flare_torch_hook_failures(), 0);
        // An address the pool never gave: a hook failure, with its message.
        flare_torch_free(0x1234 as *mut c_void, 16, 0, stream);
        assert_eq!(flare_torch_hook_failures(), 1);
        assert!(
            last_error().starts_with("flare_torch_free: "),
            "{}",
            last_error()
        );

        // One live block again, then a request beyond the device: with no handler,
        // NULL and the message (the request, the device, the tensor pool's live and
        // idle bytes: 4096 live in a 2 MiB segment, the rest of it idle).
        let q = flare_torch_alloc(4096, 0, stream);
        assert!(!q.is_null());
        let big = 2 * CAPACITY as usize;
        assert!(flare_torch_alloc(big, 0, stream).is_null());
        let message = last_error();
        let tail = format!(
            " (flare-package tensor pool: 4096 bytes live, {} bytes idle)",
            2 * MIB - 4096
        );
        assert!(
            message.starts_with(&format!(
                "flare_torch_alloc: request of {big} bytes on device 0 failed: "
            )) && message.ends_with(&tail),
            "{message}"
        );
        assert!(OOM_CALLS.lock().unwrap().is_empty());

        // With a handler: it is called with this function's name, its file and the
        // same message; it returned, so NULL.
        flare_torch_set_oom_handler(Some(record_oom));
        assert!(flare_torch_alloc(big, 0, stream).is_null());
        assert_eq!(
            OOM_CALLS.lock().unwrap().clone(),
            vec![(
                "flare_torch_alloc".to_string(),
                "src/ffi/torch.rs".to_string(),
                last_error()
            )]
        );
        // A successful allocation does not call it.
        let r = flare_torch_alloc(1, 0, stream);
        assert!(!r.is_null() && r != q);
        assert_eq!(OOM_CALLS.lock().unwrap().len(), 1);
        // Unset: back to the process's torchCheckFail, which this test process lacks
        // (no PyTorch): failures return NULL without a call again.
        flare_torch_set_oom_handler(None);
        assert!(flare_torch_alloc(big, 0, stream).is_null());
        assert_eq!(OOM_CALLS.lock().unwrap().len(), 1);

        flare_torch_free(q, 4096, 0, stream);
        flare_torch_free(r, 1, 0, stream);
        assert_eq!(flare_torch_hook_failures(), 1);
        assert_eq!(tensor_counter("block_live_bytes"), 0);
    }

    // SAFETY (every call below): as above.
    unsafe {
        // record_stream: a free on `s` of memory used on `t` too waits for `t`'s work
        // (the simulated kernel still running on it), so the next allocation on `s`
        // gets other memory; no fault (nothing touched memory it did not own).
        let (s, t) = (stream_on(0), stream_on(0));
        let p = flare_torch_alloc(MIB as usize, 0, s);
        ok(flare_torch_sim_launch(0, t, p, MIB as usize));
        flare_torch_record_stream(p, t);
        flare_torch_free(p, MIB as usize, 0, s);
        ok(flare_torch_sim_stream_complete(0, s));
        let q = flare_torch_alloc(MIB as usize, 0, s);
        assert_ne!(q, p, "reused while t's kernel still uses it");
        assert_eq!(faults(0), 0);
        ok(flare_torch_sim_stream_complete(0, t));
        flare_torch_free(q, MIB as usize, 0, s);
        flare_torch_record_stream(ptr::null_mut(), t); // NULL: nothing
        assert_eq!(flare_torch_hook_failures(), 1, "{}", last_error());

        // The graph-pool hooks: what a capture allocates is the graph pool's (none of
        // it in the tensor pool), never handed to an eager allocation, kept by reset
        // (empty_cache) while PyTorch holds the pool, and all released with it.
        flare_torch_reset();
        let before = number_in(&stats_of(0), "tensor", "physical_bytes");
        assert_eq!(before, 0, "reset released the tensor pool's idle memory");
        flare_torch_begin_allocate_to_pool(0, 11, 0, ptr::null());
        ok(flare_torch_sim_begin_capture(0, s));
        let tmp = flare_torch_alloc(3 * MIB as usize, 0, s);
        let out = flare_torch_alloc(MIB as usize, 0, s);
        flare_torch_free(tmp, 3 * MIB as usize, 0, s);
        let mut valid = -1;
        ok(flare_torch_sim_end_capture(0, s, &mut valid));
        assert_eq!(valid, 1, "the capture stayed valid");
        flare_torch_end_allocate_to_pool(0, 11, 0);
        let json = stats_of(0);
        assert!(
            json.contains("\"graph_pools\":[{\"id\":[11,0],\"live\":1,"),
            "{json}"
        );
        assert_eq!(number_in(&json, "tensor", "block_live_count"), 0);
        flare_torch_free(out, MIB as usize, 0, s);
        let eager = [
            flare_torch_alloc(MIB as usize, 0, s),
            flare_torch_alloc(3 * MIB as usize, 0, s),
        ];
        assert!(!eager.contains(&tmp) && !eager.contains(&out));
        for e in eager {
            flare_torch_free(e, 0, 0, s);
        }
        flare_torch_reset();
        let json = stats_of(0);
        assert!(
            json.contains("\"graph_pools\":[{\"id\":[11,0],\"live\":0,"),
            "{json}"
        );
        assert!(number_in(&json, "graph_pools", "physical_bytes") >= 4 * MIB);
        flare_torch_release_pool(0, 11, 0);
        let json = stats_of(0);
        assert!(json.contains("\"graph_pools\":[]"), "{json}");
        assert_eq!(number_in(&json, "created", "physical_bytes"), 0, "{json}");
        assert_eq!(flare_torch_hook_failures(), 1, "{}", last_error());
        assert_eq!(faults(0), 0);

        // Pool mode: whole mappings of exactly the segment sizes PyTorch asks for,
        // each released at its free.
        let a = flare_torch_pool_alloc(2 * MIB as usize, 1, ptr::null_mut());
        let b = flare_torch_pool_alloc(20 * MIB as usize, 1, ptr::null_mut());
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(
            number_in(&stats_of(1), "mempool", "physical_bytes"),
            22 * MIB
        );
        flare_torch_pool_free(b, 20 * MIB as usize, 1, ptr::null_mut());
        assert_eq!(
            number_in(&stats_of(1), "mempool", "physical_bytes"),
            2 * MIB
        );
        flare_torch_pool_free(a, 2 * MIB as usize, 1, ptr::null_mut());
        assert_eq!(number_in(&stats_of(1), "mempool", "physical_bytes"), 0);
        flare_torch_pool_free(ptr::null_mut(), 0, 1, ptr::null_mut()); // NULL: nothing
                                                                       // A failure is NULL with the message.
        assert!(flare_torch_pool_alloc(2 * CAPACITY as usize, 1, ptr::null_mut()).is_null());
        assert!(
            last_error().starts_with(&format!(
                "flare_torch_pool_alloc: request of {} bytes on device 1 failed: ",
                2 * CAPACITY
            )),
            "{}",
            last_error()
        );
        assert_eq!(flare_torch_hook_failures(), 1);

        // A retention scope on device 1: the free inside it keeps its memory (trim is
        // refused then), finishing it releases what it retained.
        ok(flare_torch_retention_begin(1));
        let p = flare_torch_alloc(8 * MIB as usize, 1, ptr::null_mut());
        flare_torch_free(p, 0, 1, ptr::null_mut());
        assert_eq!(flare_torch_trim(1), FlareStatus::FLARE_STATUS_SCOPE_STATE);
        assert_eq!(number_in(&stats_of(1), "tensor", "physical_bytes"), 8 * MIB);
        ok(flare_torch_retention_finish(1, 0));
        let json = stats_of(1);
        assert_eq!(number_in(&json, "tensor", "physical_bytes"), 0);
        assert_eq!(number_in(&json, "tensor", "scopes_finished"), 1);
        // Not recording: the flush does nothing and fails nothing.
        flare_torch_record_flush();
        assert_eq!(flare_torch_hook_failures(), 1);
        // trim releases what the tensor pool holds idle.
        let p = flare_torch_alloc(4096, 1, ptr::null_mut());
        flare_torch_free(p, 0, 1, ptr::null_mut());
        assert_eq!(number_in(&stats_of(1), "tensor", "physical_bytes"), 2 * MIB);
        ok(flare_torch_trim(1));
        assert_eq!(number_in(&stats_of(1), "created", "physical_bytes"), 0);
        // An aborted scope counts as aborted, not finished.
        ok(flare_torch_retention_begin(1));
        ok(flare_torch_retention_finish(1, 1));
        let json = stats_of(1);
        assert_eq!(
            (
                number_in(&json, "tensor", "scopes_finished"),
                number_in(&json, "tensor", "scopes_aborted")
            ),
            (1, 1)
        );

        // The machine has devices 0, 1 and 2 (use_simulated's count, not its
        // default of 2).
        assert!(stats_of(2).starts_with("{\"device\":2,\"backend\":\"sim\",\"created\":false"));
        assert!(
            stats_of(3).contains("device 3 does not exist"),
            "{}",
            stats_of(3)
        );

        // The flush writes what device 1's tensor pool recorded so far, up to its
        // last call (its writer would only have written on its own 200 ms later):
        // two allocations (8 MiB, 4096 bytes), each scope's begin and end, the trim.
        flare_torch_record_flush();
        assert_eq!(flare_torch_hook_failures(), 1);
        let text = std::fs::read_to_string(format!("{}.dev1.tensor.trace", record.display()))
            .expect("device 1's tensor pool's trace");
        // (`done` lines, what the pool saw of stream work, are left out.)
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("done "))
            .collect();
        let first = |l: &&str| l.split(' ').next().unwrap_or("").to_string();
        assert_eq!(
            lines.iter().map(first).collect::<Vec<_>>(),
            ["begin", "a", "f", "finish", "a", "f", "trim", "begin", "abort"],
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
