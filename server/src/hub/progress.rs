//! Download progress on stderr.

/// Progress to stderr: an indicatif bar on a terminal, a line per tenth otherwise.
pub(super) struct Report {
    bar: Option<indicatif::ProgressBar>,
    name: String,
    total: u64,
    done: u64,
    tenth: u64,
}

impl Report {
    pub(super) fn new(bar: bool) -> Report {
        Report {
            bar: bar.then(|| {
                let b = indicatif::ProgressBar::new(0);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                b
            }),
            name: String::new(),
            total: 0,
            done: 0,
            tenth: u64::MAX,
        }
    }

    pub(super) fn init(&mut self, size: u64, filename: &str) {
        self.total = size;
        self.done = 0;
        self.tenth = u64::MAX;
        self.name = filename.to_string();
        if let Some(b) = &self.bar {
            b.set_length(size);
            b.set_position(0);
            b.set_message(filename.to_string());
        }
    }

    pub(super) fn update(&mut self, n: u64) {
        self.done = self.done.saturating_add(n);
        match &self.bar {
            Some(b) => b.set_position(self.done),
            None => {
                let t = self
                    .done
                    .saturating_mul(10)
                    .checked_div(self.total)
                    .unwrap_or(10);
                if t != self.tenth {
                    self.tenth = t;
                    eprintln!(
                        "kiln: downloading {}: {}% ({:.1} of {:.1} MB)",
                        self.name,
                        t * 10,
                        self.done as f64 / 1e6,
                        self.total as f64 / 1e6
                    );
                }
            }
        }
    }

    pub(super) fn finish(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
