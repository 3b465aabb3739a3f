//! Footprint from /proc: resident memory and CPU time of a process.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Resident set size in KiB (VmRSS), 0 when the process is gone.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU time in seconds.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may contain spaces.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name and state.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i).and_then(|x| x.parse::<u64>().ok()))
        .sum();
    ticks as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    // getconf CLK_TCK; 100 on every Linux the bench runs on, asked once to be sure.
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Samples a process's RSS every 200 ms and keeps the peak, until dropped.
pub struct PeakRss {
    peak: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    pub fn start(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            loop {
                p.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        PeakRss { peak, task }
    }

    pub fn peak_kib(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the process used less than 2% of a core over 3 s (it has settled after start-up
/// or a batch of new objects), at most `max`.
pub async fn settle(pid: u32, max: Duration) {
    let start = tokio::time::Instant::now();
    let mut last = cpu_secs(pid);
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = cpu_secs(pid);
        if now - last < 0.06 || start.elapsed() > max {
            return;
        }
        last = now;
    }
}
