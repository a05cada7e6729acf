//! The allocator's configuration: [`TorchConfig`] and the environment variables
//! ([`ENV_VARS`]) it is read from.

use crate::driver::sim::SimConfig;
use crate::error::{Error, Result};
use crate::pool::{Backend, CrossStreamReuse, ReusePolicy};

/// The environment variables [`TorchConfig::from_env`] reads, with what each sets.
pub const ENV_VARS: [(&str, &str); 11] = [
    (
        "FLARE_TORCH_BACKEND",
        "`cuda` (default) or `sim` (the simulated driver: no GPU, for tests)",
    ),
    (
        "FLARE_TORCH_SIM_CAPACITY",
        "with `sim`: each simulated device's memory, bytes or a number with K/M/G/T \
         (powers of 1024); default 140G",
    ),
    (
        "FLARE_TORCH_SIM_DEVICES",
        "with `sim`: the number of simulated devices, default 2",
    ),
    (
        "FLARE_TORCH_POLICY",
        "the tensor pool's reuse policy: `segments` (default), `best-fit`, `exact`, `none`",
    ),
    (
        "FLARE_TORCH_GRAPH_POLICY",
        "the graph pools' reuse policy, same names, default `segments`",
    ),
    (
        "FLARE_TORCH_MEMPOOL_POLICY",
        "the mempool pool's reuse policy, same names, default `exact`",
    ),
    (
        "FLARE_TORCH_RELEASE_THRESHOLD",
        "the tensor pool's release threshold: `max` (default: freed memory stays \
         cached until `torch.cuda.empty_cache()` or an out-of-memory, as with \
         PyTorch's own allocator) or bytes (with K/M/G/T)",
    ),
    (
        "FLARE_TORCH_CROSS_STREAM",
        "`when-complete` (default), `wait` or `never` (see `CrossStreamReuse`)",
    ),
    (
        "FLARE_TORCH_PEERS",
        "comma-separated device ordinals every pool also grants access to (for \
         peer copies and kernels reading another device's tensors); default none",
    ),
    (
        "FLARE_TORCH_RECORD",
        "record every pool's calls as flare-trace v1 (`docs/trace-format.md`, \
         \"Recorded traces\"), one file per pool named from this path: \
         `PATH.devN.tensor.trace`, `PATH.devN.mempool.trace`, \
         `PATH.devN.graph-K.trace` (the K-th graph pool of device N, from 1); \
         replay one with `flare-replay --as-recorded`; default none",
    ),
    (
        "FLARE_TORCH_HISTORY",
        "events each pool's history ring keeps (issue 38): its recent allocations, \
         frees, mappings and out-of-memory refusals, written by \
         `flare_package.dump_snapshot(path)` as memory_viz's `device_traces`; \
         default 0 (off)",
    ),
];

/// How a [`TorchAllocator`] makes its pools.
///
/// [`TorchAllocator`]: super::TorchAllocator
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchConfig {
    /// `Backend::Cuda`, or the simulated driver (each device its own, with
    /// `device_count` devices so that peers can be named).
    pub backend: Backend,
    /// The tensor pool's policy (default [`ReusePolicy::Segments`]).
    pub tensor_policy: ReusePolicy,
    /// The graph pools' policy (default [`ReusePolicy::Segments`]).
    pub graph_policy: ReusePolicy,
    /// The mempool pool's policy (default [`ReusePolicy::Exact`]: PyTorch's segments
    /// are 2 MiB multiples, so each is one mapping of exactly its size).
    pub mempool_policy: ReusePolicy,
    /// The tensor pool's release threshold, bytes (default `u64::MAX`: nothing is
    /// released but by [`TorchAllocator::reset`] or an out-of-memory).
    ///
    /// [`TorchAllocator::reset`]: super::TorchAllocator::reset
    pub release_threshold_bytes: u64,
    /// Cross-stream reuse of every pool (default when-complete).
    pub cross_stream_reuse: CrossStreamReuse,
    /// Devices every pool grants access to besides its own.
    pub peer_devices: Vec<i32>,
    /// Record every pool's calls (`FLARE_TORCH_RECORD`; default `None`): each pool
    /// writes its own file, this path with `.devN.tensor.trace`,
    /// `.devN.mempool.trace` or `.devN.graph-K.trace` appended (the K-th graph pool
    /// made on device N, from 1), as [`PoolConfig::record_path`] says.
    ///
    /// [`PoolConfig::record_path`]: crate::pool::PoolConfig::record_path
    pub record_path: Option<std::path::PathBuf>,
    /// Events each pool's history ring keeps (`FLARE_TORCH_HISTORY`; default 0:
    /// off), as [`PoolConfig::history_events`] says.
    ///
    /// [`PoolConfig::history_events`]: crate::pool::PoolConfig::history_events
    pub history_events: usize,
}

impl Default for TorchConfig {
    fn default() -> Self {
        TorchConfig {
            backend: Backend::Cuda,
            tensor_policy: ReusePolicy::Segments,
            graph_policy: ReusePolicy::Segments,
            mempool_policy: ReusePolicy::Exact,
            release_threshold_bytes: u64::MAX,
            cross_stream_reuse: CrossStreamReuse::WhenComplete,
            peer_devices: Vec::new(),
            record_path: None,
            history_events: 0,
        }
    }
}

impl TorchConfig {
    /// The recording file of a pool of device `device` named `what` (`tensor`,
    /// `mempool`, `graph-K`): `record_path` with `.devN.WHAT.trace` appended, `None`
    /// when not recording.
    pub fn record_file(&self, device: i32, what: &str) -> Option<std::path::PathBuf> {
        self.record_path.as_ref().map(|p| {
            let mut s = p.clone().into_os_string();
            s.push(format!(".dev{device}.{what}.trace"));
            s.into()
        })
    }
}

/// Parses a byte count: digits, optionally followed by `K`, `M`, `G` or `T` (powers
/// of 1024, an optional `iB` or `B` after it).
fn parse_bytes(name: &str, s: &str) -> Result<u64> {
    let bad = || Error::InvalidArgument(format!("{name}={s:?}: not a byte count"));
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

fn parse_policy(name: &str, s: &str) -> Result<ReusePolicy> {
    ReusePolicy::ALL
        .into_iter()
        .find(|p| p.name() == s.trim())
        .ok_or_else(|| {
            let names: Vec<&str> = ReusePolicy::ALL.iter().map(|p| p.name()).collect();
            Error::InvalidArgument(format!(
                "{name}={s:?}: not a reuse policy ({})",
                names.join(", ")
            ))
        })
}

impl TorchConfig {
    /// The configuration the environment variables of [`ENV_VARS`] give (an unset
    /// or empty variable keeps its default).
    ///
    /// Errors: [`Error::InvalidArgument`] naming the variable and its value.
    pub fn from_env() -> Result<TorchConfig> {
        TorchConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`TorchConfig::from_env`] with `get` reading the variables.
    ///
    /// Errors: as [`TorchConfig::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<TorchConfig> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut c = TorchConfig::default();
        match var("FLARE_TORCH_BACKEND").as_deref().map(str::trim) {
            None | Some("cuda") => {}
            Some("sim") => {
                let mut sim = SimConfig {
                    device_count: 2,
                    ..SimConfig::default()
                };
                if let Some(v) = var("FLARE_TORCH_SIM_CAPACITY") {
                    sim.capacity_bytes = parse_bytes("FLARE_TORCH_SIM_CAPACITY", &v)?;
                }
                if let Some(v) = var("FLARE_TORCH_SIM_DEVICES") {
                    sim.device_count = v.trim().parse().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "FLARE_TORCH_SIM_DEVICES={v:?}: not a device count"
                        ))
                    })?;
                }
                crate::backend::validate_sim_machine(&sim).map_err(|e| match e {
                    Error::InvalidArgument(m) => Error::InvalidArgument(format!(
                        "FLARE_TORCH_SIM_CAPACITY / FLARE_TORCH_SIM_DEVICES: {m}"
                    )),
                    e => e,
                })?;
                c.backend = Backend::Simulated(sim);
            }
            Some(other) => {
                return Err(Error::InvalidArgument(format!(
                    "FLARE_TORCH_BACKEND={other:?}: not `cuda` or `sim`"
                )))
            }
        }
        if let Some(v) = var("FLARE_TORCH_POLICY") {
            c.tensor_policy = parse_policy("FLARE_TORCH_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_GRAPH_POLICY") {
            c.graph_policy = parse_policy("FLARE_TORCH_GRAPH_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_MEMPOOL_POLICY") {
            c.mempool_policy = parse_policy("FLARE_TORCH_MEMPOOL_POLICY", &v)?;
        }
        if let Some(v) = var("FLARE_TORCH_RELEASE_THRESHOLD") {
            c.release_threshold_bytes = match v.trim() {
                "max" => u64::MAX,
                _ => parse_bytes("FLARE_TORCH_RELEASE_THRESHOLD", &v)?,
            };
        }
        if let Some(v) = var("FLARE_TORCH_CROSS_STREAM") {
            c.cross_stream_reuse = v
                .trim()
                .parse()
                .map_err(|e| Error::InvalidArgument(format!("FLARE_TORCH_CROSS_STREAM: {e}")))?;
        }
        if let Some(v) = var("FLARE_TORCH_PEERS") {
            for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let d: i32 = p.parse().map_err(|_| {
                    Error::InvalidArgument(format!(
                        "FLARE_TORCH_PEERS={v:?}: {p:?} is not a device ordinal"
                    ))
                })?;
                c.peer_devices.push(d);
            }
        }
        if let Some(v) = var("FLARE_TORCH_HISTORY") {
            c.history_events = v.trim().parse().map_err(|_| {
                Error::InvalidArgument(format!("FLARE_TORCH_HISTORY={v:?}: not a number of events"))
            })?;
        }
        if let Some(v) = get("FLARE_TORCH_RECORD").filter(|v| !v.is_empty()) {
            // A prefix of file names: `/tmp` would write `/tmp.dev0.tensor.trace` in
            // `/`, and `dir/` names no file; both are mistakes, refused here.
            let path = std::path::PathBuf::from(&v);
            if v.ends_with('/') || path.is_dir() {
                return Err(Error::InvalidArgument(format!(
                    "FLARE_TORCH_RECORD={v:?} is a directory: give a prefix of file names \
                     in it, e.g. {:?}",
                    path.join("run")
                )));
            }
            c.record_path = Some(path);
        }
        Ok(c)
    }
}
