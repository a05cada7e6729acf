//! Recording: a pool with [`PoolConfig::record_path`](super::PoolConfig::record_path)
//! writes every call it serves as flare-trace v1 (`docs/trace-format.md`, "Recorded
//! traces").
//!
//! Off the hot path: a call appends its line to one in-memory buffer (a mutex taken
//! for the append only, the integers formatted by hand: no allocation); a buffer
//! that passes [`FLUSH_AT`] bytes is queued, under the same mutex, for a writer
//! thread, which writes the queue, and every [`FLUSH_EVERY`] the buffer too, to
//! the file. Buffers are queued and taken under the mutex the lines are appended
//! under, so the file holds the lines in the order they were appended.
//! The pool's drop (and [`Pool::destroy`](super::Pool::destroy)) writes what is left
//! and joins the writer; [`Pool::record_flush`](super::Pool::record_flush) writes
//! what was recorded so far and waits for it.
//!
//! Never fails a pool call: a file that cannot be created or written (a missing
//! directory, a full disk) stops the recording; the first error is kept
//! ([`Pool::record_error`](super::Pool::record_error)) and reported once on standard
//! error.
//!
//! Ordering: while recording, the calls that change the pool run one at a time, each
//! holding [`Pool::record_order`] from its start to its last line, so the file is
//! the order the calls ran in, from any thread, and a replay in one thread makes the
//! decisions the recorded calls made. What the pool learns from outside (a stream's
//! work seen complete, an out-of-memory from the driver) is recorded where it is
//! learnt, before the line of the call that learnt it.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Pool, PoolConfig};
use crate::driver::{DevicePtr, Stream};

/// The buffer is handed to the writer thread when it holds this many bytes.
pub(super) const FLUSH_AT: usize = 256 << 10;

/// The writer thread takes what the buffer holds at least this often.
pub(super) const FLUSH_EVERY: Duration = Duration::from_millis(200);

thread_local! {
    /// Out-of-memory answers of the driver seen by the calling thread's current
    /// allocation (written with its line: `oom N`).
    static OOMS: Cell<u32> = const { Cell::new(0) };
}

/// What the writer thread is sent.
enum Msg {
    /// Buffers were queued: write them.
    Queued,
    /// Write everything queued, then answer.
    Flush(mpsc::Sender<()>),
}

/// The lines not yet written: the buffer being appended to and the full buffers
/// queued before it, oldest first.
struct Lines {
    cur: Vec<u8>,
    queued: VecDeque<Vec<u8>>,
}

impl Lines {
    /// Everything queued, and with `all` the buffer too, in append order.
    fn take(&mut self, all: bool) -> VecDeque<Vec<u8>> {
        let mut out = std::mem::take(&mut self.queued);
        if all && !self.cur.is_empty() {
            out.push_back(std::mem::take(&mut self.cur));
        }
        out
    }
}

/// The state the appending threads and the writer share.
struct Shared {
    /// Lines not yet written.
    buf: parking_lot::Mutex<Lines>,
    /// Buffers the writer wrote out, for the appenders to reuse (no allocation and
    /// no page faults on a new buffer).
    spare: parking_lot::Mutex<Vec<Vec<u8>>>,
    /// Set once the recording stopped (an I/O error): appends return at once.
    stopped: AtomicBool,
    /// The first error, as reported.
    error: Mutex<Option<String>>,
    /// The file, for messages.
    path: PathBuf,
}

impl Shared {
    /// Keeps the first error, stops the recording and reports it once on stderr.
    fn fail(&self, what: &str, err: &std::io::Error) {
        let msg = format!(
            "flare-package: recording to {} stopped: {what}: {err}",
            self.path.display()
        );
        let first = {
            let mut e = self.error.lock().unwrap_or_else(|p| p.into_inner());
            if e.is_none() {
                *e = Some(msg.clone());
                true
            } else {
                false
            }
        };
        self.stopped.store(true, Ordering::Release);
        if first {
            eprintln!("{msg}");
        }
    }
}

/// A pool's recording (see the module documentation).
pub(super) struct Recorder {
    /// Held by each recorded call from its start to its last line ([`Pool::record_order`]).
    order: parking_lot::ReentrantMutex<()>,
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Recorder {
    /// Opens `path` (created or truncated) and writes the header: the format line and
    /// the pool's configuration (`# flare-pool key=value ...`). A file that cannot be
    /// created gives a recorder that is stopped already, its error kept and reported.
    pub(super) fn open(path: &Path, header: &str) -> Recorder {
        let shared = Arc::new(Shared {
            buf: parking_lot::Mutex::new(Lines {
                cur: Vec::with_capacity(FLUSH_AT + 4096),
                queued: VecDeque::new(),
            }),
            spare: parking_lot::Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            error: Mutex::new(None),
            path: path.to_path_buf(),
        });
        let (tx, rx) = mpsc::channel::<Msg>();
        let file = match File::create(path) {
            Ok(f) => Some(f),
            Err(e) => {
                shared.fail("cannot create the file", &e);
                None
            }
        };
        let writer = file.and_then(|file| {
            let s = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("flare-record".into())
                .spawn(move || write_loop(file, rx, s))
                .map_err(|e| shared.fail("cannot start the writer thread", &e))
                .ok()
        });
        let r = Recorder {
            order: parking_lot::ReentrantMutex::new(()),
            shared,
            tx: Mutex::new(writer.as_ref().map(|_| tx)),
            writer: Mutex::new(writer),
        };
        r.append(|b| b.extend_from_slice(header.as_bytes()));
        r
    }

    /// The first I/O error, once the recording stopped.
    pub(super) fn error(&self) -> Option<String> {
        self.shared
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Appends with `f`; queues the buffer for the writer when it is full (under
    /// the same lock: buffers are queued in the order they were filled).
    #[inline]
    fn append(&self, f: impl FnOnce(&mut Vec<u8>)) {
        if self.shared.stopped.load(Ordering::Relaxed) {
            return;
        }
        let full = {
            let mut b = self.shared.buf.lock();
            f(&mut b.cur);
            let full = b.cur.len() >= FLUSH_AT;
            if full {
                let next = self
                    .shared
                    .spare
                    .lock()
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(FLUSH_AT + 4096));
                let data = std::mem::replace(&mut b.cur, next);
                b.queued.push_back(data);
            }
            full
        };
        if full {
            self.send(Msg::Queued);
        }
    }

    fn send(&self, msg: Msg) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = tx.as_ref() {
            let _ = tx.send(msg);
        }
    }

    /// `a ID BYTES [TAG [STREAM]]`, after an `oom N` line when the driver answered
    /// out-of-memory during this allocation.
    #[inline]
    pub(super) fn alloc(&self, ptr: DevicePtr, bytes: u64, tag: u32, stream: Option<Stream>) {
        self.alloc_line(Some(ptr), bytes, tag, stream);
    }

    /// `x BYTES [TAG [STREAM]]`: an allocation that failed with out-of-memory (the
    /// pool released idle memory and retried first, which the replay must do too),
    /// after its `oom N` line.
    pub(super) fn failed(&self, bytes: u64, tag: u32, stream: Option<Stream>) {
        self.alloc_line(None, bytes, tag, stream);
    }

    /// `a ID ...` for `Some(ptr)`, `x ...` for `None`.
    #[inline]
    fn alloc_line(&self, ptr: Option<DevicePtr>, bytes: u64, tag: u32, stream: Option<Stream>) {
        let ooms = OOMS.with(|c| c.replace(0));
        self.append(|b| {
            if ooms > 0 {
                b.extend_from_slice(b"oom ");
                dec(b, u64::from(ooms));
                b.push(b'\n');
            }
            match ptr {
                Some(ptr) => {
                    b.extend_from_slice(b"a ");
                    hex(b, ptr);
                    b.push(b' ');
                }
                None => b.extend_from_slice(b"x "),
            }
            dec(b, bytes);
            if tag != 0 || stream.is_some() {
                b.push(b' ');
                dec(b, u64::from(tag));
            }
            if let Some(s) = stream {
                b.push(b' ');
                hex(b, s.raw());
            }
            b.push(b'\n');
        });
    }

    /// `f ID [STREAM]`.
    #[inline]
    pub(super) fn free(&self, ptr: DevicePtr, stream: Option<Stream>) {
        self.append(|b| free_line(b, ptr, stream));
    }

    /// `r ID STREAM` (`record_stream`).
    pub(super) fn record_stream(&self, ptr: DevicePtr, stream: Stream) {
        self.append(|b| {
            b.extend_from_slice(b"r ");
            hex(b, ptr);
            b.push(b' ');
            hex(b, stream.raw());
            b.push(b'\n');
        });
    }

    /// `forget STREAM` (`Pool::forget_stream`).
    pub(super) fn forget(&self, stream: Stream) {
        self.append(|b| {
            b.extend_from_slice(b"forget ");
            hex(b, stream.raw());
            b.push(b'\n');
        });
    }

    /// `done STREAM MARK`: the pool saw the work of `stream` complete through its
    /// `mark`-th stream-ordered free. While `held` is holding (a stream-ordered
    /// free's locked section), the line waits there for the free's own line.
    pub(super) fn done(&self, held: &mut Held, stream: Stream, mark: u64) {
        if held.holding {
            done_line(&mut held.lines, stream, mark);
        } else {
            self.append(|b| done_line(b, stream, mark));
        }
    }

    /// `f ID STREAM` of a stream-ordered free, after the lines `held` holds (its
    /// poll's `done` lines), in one append; `held` stops holding.
    pub(super) fn free_after(&self, held: &mut Held, ptr: DevicePtr, stream: Stream) {
        self.append(|b| {
            b.extend_from_slice(&held.lines);
            free_line(b, ptr, Some(stream));
        });
        held.lines.clear();
        held.holding = false;
    }

    /// A keyword line (`begin`, `finish`, `abort`, `trim`, `step`), or any whole line.
    pub(super) fn line(&self, text: &str) {
        self.append(|b| {
            b.extend_from_slice(text.as_bytes());
            b.push(b'\n');
        });
    }

    /// Writes what was recorded so far to the file and waits for it.
    pub(super) fn flush(&self) {
        {
            let mut b = self.shared.buf.lock();
            if !b.cur.is_empty() {
                let data = std::mem::take(&mut b.cur);
                b.queued.push_back(data);
            }
        }
        let (tx, rx) = mpsc::channel();
        self.send(Msg::Flush(tx));
        let _ = rx.recv();
    }

    /// Writes what is left and joins the writer (the pool's drop): the writer
    /// writes everything queued and the buffer once the channel closes.
    pub(super) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

/// Lines a locked section learnt before its call's own line, held back to be
/// appended with it (part of the pool's books, under its lock).
///
/// A stream-ordered free makes a mark and may poll its fences in the same locked
/// section: its poll can see the fence covering that very mark complete, and the
/// `done` line must come before the free's `f` line (what the pool learnt during a
/// call comes before the call's line) but after no other call's line. Appended
/// separately, another thread's line written outside the lock (an allocation's, a
/// thread cache's free) could come between the two, and the file then named a mark
/// before the line that makes it (issue 34: a four-thread recording refused by the
/// parser in most runs).
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Whether `done` lines are held now.
    holding: bool,
    /// The held lines.
    lines: Vec<u8>,
}

impl Held {
    /// Starts holding `done` lines (until [`Recorder::free_after`]).
    pub(super) fn hold(&mut self) {
        self.holding = true;
    }
}

/// Appends `done STREAM MARK`.
fn done_line(b: &mut Vec<u8>, stream: Stream, mark: u64) {
    b.extend_from_slice(b"done ");
    hex(b, stream.raw());
    b.push(b' ');
    dec(b, mark);
    b.push(b'\n');
}

/// Appends `f ID [STREAM]`.
#[inline]
fn free_line(b: &mut Vec<u8>, ptr: DevicePtr, stream: Option<Stream>) {
    b.extend_from_slice(b"f ");
    hex(b, ptr);
    if let Some(s) = stream {
        b.push(b' ');
        hex(b, s.raw());
    }
    b.push(b'\n');
}

/// The calling thread's allocation got an out-of-memory answer from the driver
/// (counted for its `oom` line).
pub(super) fn note_oom() {
    OOMS.with(|c| c.set(c.get().saturating_add(1)));
}

/// The calling thread's allocation is over without a line (it failed): its
/// out-of-memory answers are forgotten.
pub(super) fn forget_ooms() {
    OOMS.with(|c| c.set(0));
}

impl Pool {
    /// Records a tagged allocation (`a ID BYTES TAG [STREAM]`), when recording.
    pub(super) fn record_tagged(
        &self,
        ptr: DevicePtr,
        bytes: u64,
        tag: u32,
        stream: Option<Stream>,
    ) {
        if let Some(rec) = &self.rec {
            rec.alloc(ptr, bytes, tag, stream);
        }
    }

    /// A failed allocation call: an out-of-memory (whose retry released idle memory)
    /// is written as an `x` line; any other error forgets its out-of-memory answers.
    pub(super) fn record_failed(
        &self,
        e: &crate::Error,
        bytes: u64,
        tag: u32,
        stream: Option<Stream>,
    ) {
        if let Some(rec) = &self.rec {
            if matches!(e, crate::Error::OutOfMemory { .. }) {
                rec.failed(bytes, tag, stream);
            } else {
                forget_ooms();
            }
        }
    }

    /// While recording, the order of the calls that change the pool: each holds the
    /// returned guard from before its first locked section to after its last line,
    /// so the file lists the calls in the order they ran, and a replay in one
    /// thread decides as each call did. `None` (nothing held) when not recording.
    ///
    /// Why the whole call: an allocation decides to create memory in one locked
    /// section and knows its address only after the driver calls outside the lock;
    /// a call of another thread that learnt a fence complete meanwhile (a `done`
    /// line) would otherwise come first in the file, and the replay would reuse the
    /// memory that fence frees where the recorded call created new memory (issue
    /// 34: a four-thread recording replayed 4 MiB under its recorded peak once in
    /// forty). Reentrant: a recorded call made inside another (a tag-0 allocation
    /// through the tagged function) takes it again. Recording is for diagnosis: a
    /// pool that records runs its calls one at a time.
    #[inline]
    pub(super) fn record_order(&self) -> Option<parking_lot::ReentrantMutexGuard<'_, ()>> {
        self.rec.as_ref().map(|r| r.order.lock())
    }

    /// An allocation call starts: out-of-memory answers counted by an earlier call
    /// of this thread that failed are forgotten, when recording.
    #[inline]
    pub(super) fn record_call_start(&self) {
        if self.rec.is_some() {
            forget_ooms();
        }
    }
}

/// The writer thread: writes what is queued when told, and the buffer too every
/// [`FLUSH_EVERY`], until the recorder closes (then everything left) or a write
/// fails. Buffers are taken under the lock they are appended and queued under, in
/// order, and written by this thread alone: the file holds the lines in append
/// order.
fn write_loop(mut file: File, rx: mpsc::Receiver<Msg>, shared: Arc<Shared>) {
    let write = |file: &mut File, all: bool| {
        let buffers = shared.buf.lock().take(all);
        for mut d in buffers {
            if !shared.stopped.load(Ordering::Acquire) {
                if let Err(e) = file.write_all(&d) {
                    shared.fail("write failed", &e);
                }
            }
            d.clear();
            let mut spare = shared.spare.lock();
            if spare.len() < 2 && d.capacity() >= FLUSH_AT {
                spare.push(d);
            }
        }
    };
    loop {
        match rx.recv_timeout(FLUSH_EVERY) {
            Ok(Msg::Queued) => write(&mut file, false),
            Ok(Msg::Flush(ack)) => {
                write(&mut file, false);
                if let Err(e) = file.flush() {
                    shared.fail("flush failed", &e);
                }
                let _ = ack.send(());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => write(&mut file, true),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                write(&mut file, true);
                break;
            }
        }
    }
    if !shared.stopped.load(Ordering::Acquire) {
        if let Err(e) = file.sync_data() {
            // A full disk may surface only here (delayed allocation).
            if e.kind() != std::io::ErrorKind::InvalidInput {
                shared.fail("sync failed", &e);
            }
        }
    }
}

/// Appends `v` in lowercase hexadecimal with a `0x` prefix.
#[inline]
fn hex(b: &mut Vec<u8>, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut tmp = [0u8; 16];
    let mut i = tmp.len();
    let mut v = v;
    loop {
        i -= 1;
        tmp[i] = DIGITS[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    b.extend_from_slice(b"0x");
    b.extend_from_slice(&tmp[i..]);
}

/// Appends `v` in decimal.
#[inline]
fn dec(b: &mut Vec<u8>, v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let mut v = v;
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    b.extend_from_slice(&tmp[i..]);
}

/// The header of a recorded trace: the format line, the library version, and the
/// pool's configuration as one `# flare-pool` comment line
/// ([`crate::trace::RecordedConfig`] reads it back).
pub(super) fn header(config: &PoolConfig, granularity: u64, device_total: u64) -> String {
    format!(
        "# flare-trace v1\n# recorded by flare-package {} (docs/trace-format.md, \"Recorded traces\")\n\
         # flare-pool policy={} granularity={} device_total={} release_threshold={} \
         best_fit_waste_percent={} cross_stream={} segment_whole_threshold={} \
         thread_cache_entries={} thread_cache_bytes={} device={} peers={}\n",
        env!("CARGO_PKG_VERSION"),
        config.reuse_policy.name(),
        granularity,
        device_total,
        config.release_threshold_bytes,
        config.best_fit_max_waste_percent,
        config.cross_stream_reuse.name(),
        config.segment_whole_threshold_bytes,
        config.thread_cache_entries,
        config.thread_cache_bytes,
        config.device,
        if config.peer_devices.is_empty() {
            "none".to_string()
        } else {
            config
                .peer_devices
                .iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
    )
}

impl Pool {
    /// An out-of-memory answer `e` of the driver during the calling thread's
    /// allocation: counted for the `oom N` line before that allocation's line, when
    /// recording. Returns `e`.
    pub(super) fn noted_oom(&self, e: crate::driver::DriverError) -> crate::driver::DriverError {
        if self.rec.is_some() {
            note_oom();
        }
        e
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed step is their failure
mod tests {
    /// Lines appended by several threads at once reach the file in the order they
    /// were appended: each thread's lines in its own order. Three threads append
    /// lines of 100 KiB (a buffer is queued for the writer every three lines), one
    /// appends short lines every 30 ms (the writer takes the buffer itself every
    /// 200 ms). Before the fix a thread that filled the buffer sent it to the writer
    /// after letting the buffer's lock go: delayed there (descheduled), a later
    /// buffer, or the writer's own take of the next one, reached the file first
    /// (seen with a delay of 300 ms put there; without one the window is a few
    /// instructions wide, which a loaded machine's scheduler opens at times).
    #[test]
    fn buffers_reach_the_file_in_the_order_they_were_filled() {
        const THREADS: usize = 4;
        const LINES: usize = 30;
        let path =
            std::env::temp_dir().join(format!("flare-record-order-{}.trace", std::process::id()));
        let rec = super::Recorder::open(&path, "# header\n");
        let pad = "x".repeat(100 << 10);
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (rec, pad) = (&rec, &pad);
                sc.spawn(move || {
                    for i in 0..LINES {
                        if t == 0 {
                            rec.line(&format!("# {t} {i}"));
                            std::thread::sleep(super::Duration::from_millis(30));
                        } else {
                            rec.line(&format!("# {t} {i} {pad}"));
                        }
                    }
                });
            }
        });
        rec.close();
        assert_eq!(rec.error(), None);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let mut next = [0usize; THREADS];
        for line in text.lines().skip(1) {
            let mut f = line.split(' ').skip(1);
            let t: usize = f.next().unwrap().parse().unwrap();
            let i: usize = f.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [LINES; THREADS]);
    }

    #[test]
    fn integers_format_as_std_does() {
        for v in [0u64, 1, 9, 10, 15, 16, 255, 4096, 1 << 40, u64::MAX] {
            let mut b = Vec::new();
            super::dec(&mut b, v);
            assert_eq!(String::from_utf8_lossy(&b), v.to_string());
            let mut b = Vec::new();
            super::hex(&mut b, v);
            assert_eq!(String::from_utf8_lossy(&b), format!("{v:#x}"));
        }
    }
}
