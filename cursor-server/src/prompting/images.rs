//! Images in provider requests: the bytes a request shows (`ImageSet`, loaded by the run and keyed
//! by blob), how a family's documented limits (`ImageLimits`, declared by its module in
//! `provider/`) are applied, and the text a model is given in place of an image it cannot be shown
//! (`Part`, which each family's module turns into its own image or text part).
//!
//! Its own file because `prompting/projector.rs` holds the three families' message shapes within
//! 800 lines, and which images a request shows (limits, vision, order) is one decision of its own,
//! made the same way for every family.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;

use crate::config::ModelConfig;
use crate::model::conversation::{BlobId, ImageMime, ImageRef};

/// The images a request may show, base64-encoded once per run (not once per provider call).
#[derive(Debug, Clone, Default)]
pub struct ImageSet {
    encoded: HashMap<BlobId, Arc<str>>,
}

impl ImageSet {
    pub fn contains(&self, id: BlobId) -> bool {
        self.encoded.contains_key(&id)
    }

    pub fn insert(&mut self, id: BlobId, data: &[u8]) {
        let text = base64::engine::general_purpose::STANDARD.encode(data);
        self.encoded.insert(id, Arc::from(text));
    }

    fn base64(&self, id: BlobId) -> Option<&str> {
        self.encoded.get(&id).map(|text| &**text)
    }
}

/// What a provider family documents as the most it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    pub family: &'static str,
    /// One image's size (decoded bytes).
    pub max_bytes: u64,
    /// Images in one request.
    pub max_count: usize,
    /// All images of one request together (decoded bytes), within the request-size limit once
    /// base64 adds its third.
    pub max_total_bytes: u64,
}

pub const MB: u64 = 1024 * 1024;

/// Why one message's images cannot be sent: too large or too many for the family.
pub fn check_message(limits: ImageLimits, images: &[ImageRef]) -> Result<(), String> {
    if images.len() > limits.max_count {
        return Err(format!(
            "{} images are attached; {} takes at most {} per request",
            images.len(),
            limits.family,
            limits.max_count
        ));
    }
    if let Some(image) = images.iter().find(|i| i.bytes > limits.max_bytes) {
        return Err(format!(
            "the image {} is larger than the {} MB {} takes per image",
            image.label(),
            limits.max_bytes / MB,
            limits.family
        ));
    }
    Ok(())
}

/// One image as a request shows it: the image, or a note in its place.
pub enum Part<'a> {
    Image { mime: ImageMime, base64: &'a str },
    Note(String),
}

/// An image as a `data:` URL (how the OpenAI families take inline images).
pub fn data_url(mime: ImageMime, base64: &str) -> String {
    format!("data:{};base64,{base64}", mime.as_str())
}

/// Hands out the parts of a request's images in history order: the newest images within the
/// family's count and size limits are shown, older ones are named instead (so a long conversation
/// with many screenshots keeps working); a model without vision gets a note for each.
pub struct Gallery<'a> {
    set: &'a ImageSet,
    model: &'a ModelConfig,
    limits: ImageLimits,
    /// How many of the request's images, oldest first, are named rather than shown.
    hidden: usize,
    seen: usize,
}

impl<'a> Gallery<'a> {
    /// `all`: every image of the request, in history order.
    pub fn new<'i>(
        limits: ImageLimits,
        model: &'a ModelConfig,
        set: &'a ImageSet,
        all: impl DoubleEndedIterator<Item = &'i ImageRef> + ExactSizeIterator,
    ) -> Gallery<'a> {
        let total = all.len();
        let (mut shown, mut bytes) = (0usize, 0u64);
        for image in all.rev() {
            if shown == limits.max_count || bytes + image.bytes > limits.max_total_bytes {
                break;
            }
            shown += 1;
            bytes += image.bytes;
        }
        Gallery {
            set,
            model,
            limits,
            hidden: total - shown,
            seen: 0,
        }
    }

    /// The next image's part (call once per image, in history order).
    pub fn part(&mut self, image: &ImageRef) -> Part<'a> {
        let older = self.seen < self.hidden;
        self.seen += 1;
        if !self.model.vision {
            return Part::Note(format!(
                "[Image {}: not shown, the model {} is not configured to see images.]",
                image.label(),
                self.model.id
            ));
        }
        if older {
            return Part::Note(format!(
                "[Image {}: not shown, {} takes at most {} images ({} MB) per request and newer ones are shown.]",
                image.label(),
                self.limits.family,
                self.limits.max_count,
                self.limits.max_total_bytes / MB
            ));
        }
        match self.set.base64(image.blob) {
            Some(base64) => Part::Image {
                mime: image.mime,
                base64,
            },
            None => Part::Note(format!(
                "[Image {}: not shown, its data is no longer stored.]",
                image.label()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{anthropic, openai_chat, openai_responses};

    fn image(n: u8, bytes: u64) -> ImageRef {
        ImageRef {
            blob: BlobId([n; 32]),
            mime: ImageMime::Png,
            bytes,
            name: format!("shot{n}.png"),
        }
    }

    fn model(vision: bool) -> ModelConfig {
        ModelConfig {
            id: "m".into(),
            upstream_id: "m".into(),
            display_name: "M".into(),
            context_window: 1000,
            reasoning: false,
            max_output_tokens: None,
            thinking_budget: None,
            vision,
            quirks: crate::config::Quirks {
                stream_usage: true,
                reasoning_content_on_tool_calls: false,
                extra_body: serde_json::Map::new(),
            },
            pricing: None,
            aliases: Vec::new(),
            fallbacks: Vec::new(),
            context_fallback: None,
        }
    }

    #[test]
    fn the_newest_images_within_the_count_limit_are_shown_and_older_ones_named() {
        let images: Vec<ImageRef> = (0..102).map(|n| image(n, 10)).collect();
        let mut set = ImageSet::default();
        for i in &images {
            set.insert(i.blob, b"\x89PNG\r\n\x1a\n");
        }
        let model = model(true);
        let mut gallery = Gallery::new(anthropic::IMAGE_LIMITS, &model, &set, images.iter());
        let parts: Vec<bool> = images
            .iter()
            .map(|i| matches!(gallery.part(i), Part::Image { .. }))
            .collect();
        assert_eq!(parts.iter().filter(|shown| !**shown).count(), 2);
        assert!(!parts[0] && !parts[1] && parts[2] && parts[101]);
    }

    #[test]
    fn a_model_without_vision_gets_a_note_naming_the_image() {
        let shot = image(1, 2048);
        let mut set = ImageSet::default();
        set.insert(shot.blob, b"x");
        let model = model(false);
        let mut gallery = Gallery::new(
            openai_chat::IMAGE_LIMITS,
            &model,
            &set,
            std::slice::from_ref(&shot).iter(),
        );
        let Part::Note(note) = gallery.part(&shot) else {
            panic!("a text-only model was sent an image");
        };
        assert!(note.contains("shot1.png (image/png, 2 KB)") && note.contains("not configured"));
    }

    #[test]
    fn one_image_over_the_family_limit_is_a_clear_error() {
        let big = image(1, 6 * MB);
        let error = check_message(anthropic::IMAGE_LIMITS, std::slice::from_ref(&big)).unwrap_err();
        assert!(
            error.contains("5 MB") && error.contains("shot1.png"),
            "{error}"
        );
        assert!(check_message(openai_responses::IMAGE_LIMITS, &[big]).is_ok());
    }
}
