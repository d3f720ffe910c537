//! Token usage as reported by providers, and its sum over the provider calls of one run.

use serde::{Deserialize, Serialize};

/// One provider call's usage, normalised: `input_tokens` includes cached input (the OpenAI convention);
/// fields a provider did not report stay `None` so they can be omitted downstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cache_read_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
}

impl Usage {
    /// Adds `other` into `self`; a field stays `None` only if neither side reported it.
    pub fn accumulate(&mut self, other: &Usage) {
        fn add(into: &mut Option<u64>, value: Option<u64>) {
            if let Some(value) = value {
                *into = Some(into.unwrap_or(0).saturating_add(value));
            }
        }
        add(&mut self.input_tokens, other.input_tokens);
        add(&mut self.output_tokens, other.output_tokens);
        add(&mut self.cache_read_tokens, other.cache_read_tokens);
        add(&mut self.cache_write_tokens, other.cache_write_tokens);
        add(&mut self.reasoning_tokens, other.reasoning_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulate_sums_reported_fields_and_keeps_unreported_ones_absent() {
        let mut total = Usage::default();
        total.accumulate(&Usage {
            input_tokens: Some(10),
            output_tokens: Some(2),
            cache_read_tokens: Some(4),
            ..Usage::default()
        });
        total.accumulate(&Usage {
            input_tokens: Some(15),
            output_tokens: Some(3),
            ..Usage::default()
        });
        assert_eq!(total.input_tokens, Some(25));
        assert_eq!(total.output_tokens, Some(5));
        assert_eq!(total.cache_read_tokens, Some(4));
        assert_eq!(total.cache_write_tokens, None);
        assert_eq!(total.reasoning_tokens, None);
    }
}
