//! The configuration header of a recorded trace: the `# flare-pool key=value ...`
//! comment line a recording pool writes first (`docs/trace-format.md`, "Recorded
//! traces"), read back so that a replay runs with the recorded pool's settings.

use super::{Excerpt, Problem};
use crate::driver::sim::SimConfig;
use crate::pool::{Backend, CrossStreamReuse, PoolConfig, ReusePolicy};

/// The start of a recorded trace's configuration line.
pub const RECORDED_HEADER: &str = "# flare-pool ";

/// The keys of the header, each required once ([`RecordedConfig::parse`]).
pub const RECORDED_KEYS: [&str; 11] = [
    "policy",
    "granularity",
    "device_total",
    "release_threshold",
    "best_fit_waste_percent",
    "cross_stream",
    "segment_whole_threshold",
    "thread_cache_entries",
    "thread_cache_bytes",
    "device",
    "peers",
];

/// The settings of a recorded pool, as its trace's header gives them. Byte fields
/// are bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedConfig {
    /// The reuse policy (`policy=`).
    pub policy: ReusePolicy,
    /// The allocation granularity (`granularity=`).
    pub granularity: u64,
    /// The device's total memory (`device_total=`; `u64::MAX` when the query failed).
    pub device_total: u64,
    /// `release_threshold=`.
    pub release_threshold: u64,
    /// `best_fit_waste_percent=`.
    pub best_fit_waste_percent: u32,
    /// `cross_stream=`.
    pub cross_stream: CrossStreamReuse,
    /// `segment_whole_threshold=`.
    pub segment_whole_threshold: u64,
    /// `thread_cache_entries=`.
    pub thread_cache_entries: u32,
    /// `thread_cache_bytes=`.
    pub thread_cache_bytes: u64,
    /// The device ordinal (`device=`).
    pub device: i32,
    /// The peer devices (`peers=1,2`, or `none`).
    pub peers: Vec<i32>,
}

impl Default for RecordedConfig {
    /// A default [`PoolConfig`]'s settings on the default simulated device.
    fn default() -> Self {
        let c = PoolConfig::default();
        let sim = SimConfig::default();
        RecordedConfig {
            policy: c.reuse_policy,
            granularity: sim.granularity_bytes,
            device_total: sim.capacity_bytes,
            release_threshold: c.release_threshold_bytes,
            best_fit_waste_percent: c.best_fit_max_waste_percent,
            cross_stream: c.cross_stream_reuse,
            segment_whole_threshold: c.segment_whole_threshold_bytes,
            thread_cache_entries: c.thread_cache_entries,
            thread_cache_bytes: c.thread_cache_bytes,
            device: c.device,
            peers: Vec::new(),
        }
    }
}

/// A header field that cannot be read, quoted as an [`Excerpt`] (a value of any
/// length gives a message of bounded length).
fn bad(key: &str, value: &str) -> Problem {
    // `key` is one of the names this file matches on; `value` is the trace's.
    Problem::RecordedConfig(format!("{key}={} cannot be read", Excerpt::new(value)))
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, Problem> {
    value.parse().map_err(|_| bad(key, value))
}

impl RecordedConfig {
    /// Reads the `key=value` fields after [`RECORDED_HEADER`]. Keys not named here
    /// are ignored (a later version may add some); every key named here is
    /// required, once: a recording pool writes them all, so a missing or repeated one
    /// is a header edited by hand, and a replay "as recorded" with a default in its
    /// place would not be.
    ///
    /// Errors: [`Problem::RecordedConfig`] for a value that cannot be read, a key
    /// missing or given twice, a granularity that is not a power of two or below
    /// [`SIM_MIN_GRANULARITY_BYTES`](crate::backend::SIM_MIN_GRANULARITY_BYTES), a
    /// `device_total` below one granule (the recording pool writes `u64::MAX` when
    /// its query failed), a negative device or peer ordinal, and a configuration
    /// the simulated backend refuses (a device or peer ordinal of
    /// [`SIM_MAX_DEVICES`](crate::driver::sim::SIM_MAX_DEVICES) or more, a
    /// granularity above the simulated device's memory).
    pub fn parse(fields: &str) -> Result<RecordedConfig, Problem> {
        let mut c = RecordedConfig::default();
        let mut seen = [false; RECORDED_KEYS.len()];
        for field in fields.split([' ', '\t']).filter(|f| !f.is_empty()) {
            let Some((key, value)) = field.split_once('=') else {
                continue;
            };
            if let Some(i) = RECORDED_KEYS.iter().position(|&k| k == key) {
                if std::mem::replace(&mut seen[i], true) {
                    return Err(Problem::RecordedConfig(format!("{key}= is given twice")));
                }
            }
            match key {
                "policy" => c.policy = value.parse().map_err(|_| bad(key, value))?,
                "granularity" => c.granularity = number(key, value)?,
                "device_total" => c.device_total = number(key, value)?,
                "release_threshold" => c.release_threshold = number(key, value)?,
                "best_fit_waste_percent" => c.best_fit_waste_percent = number(key, value)?,
                "cross_stream" => c.cross_stream = value.parse().map_err(|_| bad(key, value))?,
                "segment_whole_threshold" => c.segment_whole_threshold = number(key, value)?,
                "thread_cache_entries" => c.thread_cache_entries = number(key, value)?,
                "thread_cache_bytes" => c.thread_cache_bytes = number(key, value)?,
                "device" => c.device = number(key, value)?,
                "peers" => {
                    c.peers = if value == "none" {
                        Vec::new()
                    } else {
                        value
                            .split(',')
                            .map(|p| number(key, p))
                            .collect::<Result<_, _>>()?
                    }
                }
                _ => {}
            }
        }
        if let Some(i) = seen.iter().position(|&s| !s) {
            return Err(Problem::RecordedConfig(format!(
                "{}= is missing (a recording pool writes every key: {})",
                RECORDED_KEYS[i],
                RECORDED_KEYS.join(", ")
            )));
        }
        if !c.granularity.is_power_of_two() {
            return Err(Problem::RecordedConfig(format!(
                "granularity={} is not a power of two",
                c.granularity
            )));
        }
        let least = crate::backend::SIM_MIN_GRANULARITY_BYTES;
        if c.granularity < least {
            return Err(Problem::RecordedConfig(format!(
                "granularity={} is below the least a pool takes ({least} bytes)",
                c.granularity
            )));
        }
        if c.device_total < c.granularity {
            return Err(Problem::RecordedConfig(format!(
                "device_total={} is less than one granule ({} bytes): no pool ran on it",
                c.device_total, c.granularity
            )));
        }
        if c.device < 0 || c.peers.iter().any(|&p| p < 0) {
            return Err(Problem::RecordedConfig(
                "a negative device or peer ordinal".into(),
            ));
        }
        // The replay's pool must be one the simulated backend makes (a device or
        // peer ordinal beyond the machine it can simulate, say): checked by the
        // backend's own rules, so that a replay never fails to start for it.
        let config = c.pool_config();
        if let Backend::Simulated(sim) = &config.backend {
            crate::backend::validate_sim(&config, sim).map_err(|e| {
                Problem::RecordedConfig(format!("no simulated pool replays it: {e}"))
            })?;
        }
        Ok(c)
    }

    /// The configuration of a pool that replays the recorded one: these settings, on
    /// a simulated device of the recorded granularity, total memory (the default
    /// simulated device's when the recorded query failed) and device ordinals.
    pub fn pool_config(&self) -> PoolConfig {
        let defaults = SimConfig::default();
        let devices = self
            .peers
            .iter()
            .chain(std::iter::once(&self.device))
            .copied()
            .max()
            .unwrap_or(0);
        let sim = SimConfig {
            capacity_bytes: if self.device_total == u64::MAX {
                defaults.capacity_bytes
            } else {
                self.device_total
            },
            granularity_bytes: self.granularity,
            device_count: u32::try_from(devices).unwrap_or(0).saturating_add(1),
        };
        PoolConfig {
            backend: Backend::Simulated(sim),
            device: self.device,
            reuse_policy: self.policy,
            release_threshold_bytes: self.release_threshold,
            peer_devices: self.peers.clone(),
            best_fit_max_waste_percent: self.best_fit_waste_percent,
            cross_stream_reuse: self.cross_stream,
            segment_whole_threshold_bytes: self.segment_whole_threshold,
            thread_cache_entries: self.thread_cache_entries,
            thread_cache_bytes: self.thread_cache_bytes,
            record_path: None,
            history_events: 0,
        }
    }
}
