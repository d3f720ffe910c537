//! The last warnings and errors, kept in memory for the console's logs page: a tracing layer the
//! process installs beside its log output feeds a bounded ring (the oldest line goes when it is
//! full). Only what the log line says is kept — the same text the log shows, never a request body.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines kept.
const CAPACITY: usize = 500;

/// One kept log line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    pub at_ms: i64,
    pub level: &'static str,
    pub target: String,
    pub message: String,
}

fn ring() -> &'static Mutex<VecDeque<Entry>> {
    static RING: OnceLock<Mutex<VecDeque<Entry>>> = OnceLock::new();
    RING.get_or_init(|| Mutex::new(VecDeque::with_capacity(CAPACITY)))
}

/// The kept lines, newest first.
pub fn recent() -> Vec<Entry> {
    let ring = ring().lock().unwrap_or_else(PoisonError::into_inner);
    ring.iter().rev().cloned().collect()
}

/// The layer that feeds the ring with every WARN and ERROR event.
pub fn layer() -> RingLayer {
    RingLayer
}

pub struct RingLayer;

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return;
        }
        let mut text = Fields::default();
        event.record(&mut text);
        let entry = Entry {
            at_ms: crate::store::now_ms(),
            level: if level == Level::ERROR {
                "ERROR"
            } else {
                "WARN"
            },
            target: event.metadata().target().to_owned(),
            message: text.0,
        };
        let mut ring = ring().lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == CAPACITY {
            ring.pop_front();
        }
        ring.push_back(entry);
    }
}

/// An event's message first, then its other fields as `name=value`.
#[derive(Default)]
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            self.0 = format!("{value:?}");
            if !rest.is_empty() {
                self.0.push(' ');
                self.0.push_str(&rest);
            }
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    #[test]
    fn warnings_and_errors_are_kept_newest_first_and_the_rest_are_not() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not kept");
            tracing::warn!(provider = "fake", "ring test: a warning");
            tracing::error!("ring test: an error");
        });
        let kept: Vec<Entry> = recent()
            .into_iter()
            .filter(|e| e.message.contains("ring test"))
            .collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(kept[0].level, "ERROR");
        assert_eq!(kept[1].message, "ring test: a warning provider=fake");
        assert!(recent().iter().all(|e| e.message != "not kept"));
    }
}
