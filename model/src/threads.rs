//! How many threads llama.cpp gets: `min(2, idle cores)`, at least 1. ggml's threads spin at
//! barriers, so on a busy box two threads collapse (4–9 tok/s) while one keeps ~32 tok/s
//! (shared/REFERENCES.md §5); the idle share comes from two `/proc/stat` samples.

use std::time::Duration;

/// The most threads worth using for a 0.5B model on this kind of machine.
pub const MAX_THREADS: usize = 2;

/// `min(MAX_THREADS, idle cores)`, at least 1, from a `sample`-long look at `/proc/stat`
/// (falling back to `/proc/loadavg`, then to 1 when neither is readable).
pub fn default_threads(sample: Duration) -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let idle = idle_cores(sample, cores).or_else(|| idle_from_loadavg(cores)).unwrap_or(1.0);
    threads_for(idle, cores)
}

/// Rounds the idle estimate: 1.5 idle cores or more earns the second thread.
fn threads_for(idle_cores: f64, cores: usize) -> usize {
    (idle_cores.round() as usize).clamp(1, MAX_THREADS.min(cores.max(1)))
}

fn idle_cores(sample: Duration, cores: usize) -> Option<f64> {
    let a = cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)?;
    std::thread::sleep(sample);
    let b = cpu_times(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let total = b.0.checked_sub(a.0)?;
    let idle = b.1.checked_sub(a.1)?;
    if total == 0 {
        return None;
    }
    Some(idle as f64 / total as f64 * cores as f64)
}

/// (total, idle + iowait) jiffies from the aggregate `cpu` line of `/proc/stat`.
fn cpu_times(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    if fields.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let total = fields.iter().take(8).sum();
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Some((total, idle))
}

fn idle_from_loadavg(cores: usize) -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let load: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((cores as f64 - load).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_line_is_read_as_total_and_idle() {
        let stat = "cpu  100 5 50 800 20 1 2 3 0 0\ncpu0 1 1 1 1\n";
        assert_eq!(cpu_times(stat), Some((981, 820)));
        assert_eq!(cpu_times("intr 1 2"), None);
    }

    #[test]
    fn threads_stay_between_one_and_two() {
        assert_eq!(threads_for(0.0, 2), 1);
        assert_eq!(threads_for(1.4, 2), 1);
        assert_eq!(threads_for(1.6, 2), 2);
        assert_eq!(threads_for(7.0, 8), 2);
        assert_eq!(threads_for(2.0, 1), 1);
    }

    #[test]
    fn default_threads_is_in_range_here() {
        let n = default_threads(Duration::from_millis(20));
        assert!((1..=MAX_THREADS).contains(&n));
    }
}
