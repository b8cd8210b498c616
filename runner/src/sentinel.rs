//! The streaming parser of output blocks.
//!
//! A container's stdout is noise with zero or more blocks:
//!
//! ```text
//! …noise…
//! ---ARIZUKO_OUTPUT_START---
//! {"status":"ok","result":"…"}
//! ---ARIZUKO_OUTPUT_END---
//! ```
//!
//! The parser works on the byte stream, not on lines: frames follow the container's `write()`
//! calls, so a marker or a block may be split at any byte. Markers count only at the start of
//! a line, which is what every agent prints and what makes the end marker unambiguous (a JSON
//! string cannot hold a raw newline, so `\n---…END---` never occurs inside a block). A start
//! marker must also end its line: `---…START--- text` in noise opens nothing.
//!
//! Memory is bounded: noise is dropped as it goes (only a marker's length of it is kept across
//! chunk boundaries), and a block larger than `max_block` is reported and discarded.
//! A start marker that is never closed before another start marker (a fake marker printed in
//! noise) is reported as invalid and the later block is parsed normally.

use memchr::memmem::{Finder, FinderRev};

use hako_shared::contract::{Markers, OutputBlock};

/// What the parser found.
#[derive(Debug, Clone, PartialEq)]
pub enum ParseEvent {
    /// A well-formed block.
    Block(OutputBlock),
    /// Bytes between markers that are not a valid block.
    Invalid {
        /// Why it was refused (never the content itself: it may hold anything).
        reason: String,
        /// How many bytes were discarded.
        len: usize,
    },
    /// A block grew beyond the limit and was discarded.
    Oversize {
        /// The limit it crossed.
        limit: usize,
    },
}

/// Incremental parser of output blocks over a byte stream.
pub struct SentinelParser {
    start: Finder<'static>,
    /// The start pattern, searched from the end (the last start in a block wins).
    start_rev: FinderRev<'static>,
    end: Finder<'static>,
    /// `\n` + start marker, `\n` + end marker.
    start_len: usize,
    end_len: usize,
    in_block: bool,
    /// While seeking: the last `start_len - 1` bytes of noise. In a block: the block so far.
    buf: Vec<u8>,
    max_block: usize,
    /// Bytes of noise dropped so far (for the log).
    noise_bytes: u64,
}

impl SentinelParser {
    /// A parser for `markers`, discarding blocks larger than `max_block` bytes.
    pub fn new(markers: &Markers, max_block: usize) -> Self {
        let start = format!("\n{}", markers.start).into_bytes();
        let end = format!("\n{}", markers.end).into_bytes();
        let (start_len, end_len) = (start.len(), end.len());
        Self {
            start: Finder::new(&start).into_owned(),
            start_rev: FinderRev::new(&start).into_owned(),
            end: Finder::new(&end).into_owned(),
            start_len,
            end_len,
            in_block: false,
            // The stream starts at a line start: a virtual newline precedes it.
            buf: vec![b'\n'],
            max_block,
            noise_bytes: 0,
        }
    }

    /// Bytes of noise seen outside blocks.
    pub fn noise_bytes(&self) -> u64 {
        self.noise_bytes
    }

    /// Whether the parser is inside an unfinished block.
    pub fn in_block(&self) -> bool {
        self.in_block
    }

    /// Feeds one chunk, appending what it completes to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<ParseEvent>) {
        while !chunk.is_empty() {
            chunk = if self.in_block {
                self.feed_block(chunk, out)
            } else {
                self.feed_noise(chunk)
            };
        }
    }

    /// The first start marker line in `hay`: a match followed by `\n` or `\r`. `Err(p)`: the
    /// match at `p` ends `hay`, so whether it is a marker line is not known yet.
    fn find_start(&self, hay: &[u8]) -> Option<Result<usize, usize>> {
        for p in self.start.find_iter(hay) {
            match hay.get(p + self.start_len) {
                Some(b'\n' | b'\r') => return Some(Ok(p)),
                Some(_) => continue,
                None => return Some(Err(p)),
            }
        }
        None
    }

    /// Seeking a start marker. Returns the unconsumed rest of `chunk`.
    fn feed_noise<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        // A marker straddling the previous chunk: search carry + the head of this chunk. The
        // carry holds a whole marker, because its line end may only come with this chunk.
        let head = chunk.len().min(self.start_len);
        if !self.buf.is_empty() {
            let carry = self.buf.len();
            self.buf.extend_from_slice(&chunk[..head]);
            if let Some(Ok(pos)) = self.find_start(&self.buf) {
                let consumed = (pos + self.start_len).saturating_sub(carry);
                self.noise_bytes += pos.saturating_sub(carry) as u64;
                self.begin_block();
                return &chunk[consumed..];
            }
            self.buf.truncate(carry);
        }
        // A match ending this chunk (line end unknown) stays in the carry for the next one.
        if let Some(Ok(pos)) = self.find_start(chunk) {
            self.noise_bytes += pos as u64;
            self.begin_block();
            return &chunk[pos + self.start_len..];
        }
        // No marker: keep only what could begin one.
        self.noise_bytes += chunk.len() as u64;
        let keep = self.start_len;
        if chunk.len() >= keep {
            self.buf.clear();
            self.buf.extend_from_slice(&chunk[chunk.len() - keep..]);
        } else {
            self.buf.extend_from_slice(chunk);
            let excess = self.buf.len().saturating_sub(keep);
            self.buf.drain(..excess);
        }
        &[]
    }

    fn begin_block(&mut self) {
        self.in_block = true;
        self.buf.clear();
    }

    /// Inside a block: accumulate until the end marker. Returns the unconsumed rest.
    fn feed_block<'a>(&mut self, chunk: &'a [u8], out: &mut Vec<ParseEvent>) -> &'a [u8] {
        // Search only where a new end marker can be: from end_len-1 bytes before the new data.
        let from = self.buf.len().saturating_sub(self.end_len - 1);
        // Room for a full block plus a partial end marker; beyond that the block is too big.
        let cap = self.max_block + self.end_len;
        let take = chunk.len().min(cap.saturating_sub(self.buf.len()));
        self.buf.extend_from_slice(&chunk[..take]);
        if let Some(rel) = self.end.find(&self.buf[from..]) {
            let end_at = from + rel;
            let after = end_at + self.end_len;
            // Bytes of this chunk past the end marker go back to noise seeking.
            let pushed_past = self.buf.len() - after;
            let rest = &chunk[take - pushed_past..];
            let body = std::mem::take(&mut self.buf);
            self.finish_block(&body[..end_at], out);
            self.in_block = false;
            // The end marker line ended at a line start context for what follows.
            self.buf.push(b'\n');
            return rest;
        }
        if self.buf.len() >= cap {
            out.push(ParseEvent::Oversize {
                limit: self.max_block,
            });
            self.in_block = false;
            self.buf.clear();
            return &chunk[take..];
        }
        &chunk[take..]
    }

    fn finish_block(&mut self, body: &[u8], out: &mut Vec<ParseEvent>) {
        // A start marker inside the block means the earlier one was fake: keep the last.
        let body = match self
            .start_rev
            .rfind_iter(body)
            .find(|&p| matches!(body.get(p + self.start_len), Some(b'\n' | b'\r') | None))
        {
            Some(pos) => {
                out.push(ParseEvent::Invalid {
                    reason: "start marker without an end marker".into(),
                    len: pos,
                });
                &body[pos + self.start_len..]
            }
            None => body,
        };
        let text = body.trim_ascii();
        match serde_json::from_slice::<OutputBlock>(text) {
            Ok(block) => out.push(ParseEvent::Block(block)),
            Err(e) => out.push(ParseEvent::Invalid {
                reason: format!("block is not a valid output JSON: {e}"),
                len: body.len(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::contract::BlockStatus;

    fn parse_chunks(chunks: &[&[u8]]) -> Vec<ParseEvent> {
        let mut p = SentinelParser::new(&Markers::default(), 1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c, &mut out);
        }
        out
    }

    fn blocks(ev: &[ParseEvent]) -> Vec<String> {
        ev.iter()
            .filter_map(|e| match e {
                ParseEvent::Block(b) => Some(b.result.clone().unwrap_or_default()),
                _ => None,
            })
            .collect()
    }

    const STREAM: &str = "log line\n[LOG] starting\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"one\"}\n---ARIZUKO_OUTPUT_END---\nmore noise ---ARIZUKO_OUTPUT_START--- not a marker\n---ARIZUKO_OUTPUT_START--- trailing text, not a marker\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"error\",\n \"result\":\"two\",\"error\":\"e\"}\n---ARIZUKO_OUTPUT_END---\ntrailing";

    #[test]
    fn finds_blocks_in_noise() {
        let ev = parse_chunks(&[STREAM.as_bytes()]);
        assert_eq!(blocks(&ev), vec!["one", "two"]);
        assert_eq!(ev.len(), 2, "{ev:?}");
        match &ev[1] {
            ParseEvent::Block(b) => assert_eq!(b.status, BlockStatus::Error),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_split_point_gives_the_same_blocks() {
        let bytes = STREAM.as_bytes();
        let expected = parse_chunks(&[bytes]);
        for i in 0..=bytes.len() {
            let got = parse_chunks(&[&bytes[..i], &bytes[i..]]);
            assert_eq!(got, expected, "split at {i}");
        }
        // Three-way splits around both markers of the first block.
        for i in 20..70 {
            for j in i..(i + 90).min(bytes.len()) {
                let got = parse_chunks(&[&bytes[..i], &bytes[i..j], &bytes[j..]]);
                assert_eq!(got, expected, "split at {i},{j}");
            }
        }
        // One byte at a time.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(parse_chunks(&singles), expected);
    }

    #[test]
    fn marker_at_stream_start_counts() {
        let ev = parse_chunks(&[b"---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"x\"}\n---ARIZUKO_OUTPUT_END---"]);
        assert_eq!(blocks(&ev), vec!["x"]);
    }

    #[test]
    fn a_marker_with_trailing_text_is_noise() {
        let ev = parse_chunks(&[b"---ARIZUKO_OUTPUT_START--- hi\n{\"status\":\"ok\",\"result\":\"x\"}\n---ARIZUKO_OUTPUT_END---\n"]);
        assert!(ev.is_empty(), "{ev:?}");
        // Inside a block, only a marker line restarts it.
        let ev = parse_chunks(&[b"---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"a\"}\n---ARIZUKO_OUTPUT_START---x\n---ARIZUKO_OUTPUT_END---\n"]);
        assert!(
            matches!(&ev[0], ParseEvent::Invalid { reason, .. } if reason.contains("not a valid")),
            "{ev:?}"
        );
        // The line end of a marker may come in the next read.
        let ev = parse_chunks(&[
            b"x\n---ARIZUKO_OUTPUT_START---",
            b"\n{\"status\":\"ok\",\"result\":\"y\"}\n---ARIZUKO_OUTPUT_END---",
        ]);
        assert_eq!(blocks(&ev), vec!["y"]);
    }

    #[test]
    fn mid_line_markers_are_noise() {
        let ev = parse_chunks(&[b"a ---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"x\"}\n---ARIZUKO_OUTPUT_END---"]);
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn fake_start_is_reported_and_the_real_block_survives() {
        let s = b"---ARIZUKO_OUTPUT_START---\ngarbage, never closed\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"real\"}\n---ARIZUKO_OUTPUT_END---\n";
        let ev = parse_chunks(&[s]);
        assert!(matches!(ev[0], ParseEvent::Invalid { .. }), "{ev:?}");
        assert_eq!(blocks(&ev), vec!["real"]);
    }

    #[test]
    fn invalid_json_between_markers_is_reported_not_fatal() {
        let s = b"---ARIZUKO_OUTPUT_START---\n{not json}\n---ARIZUKO_OUTPUT_END---\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"after\"}\n---ARIZUKO_OUTPUT_END---\n";
        let ev = parse_chunks(&[s]);
        assert!(
            matches!(&ev[0], ParseEvent::Invalid { reason, .. } if reason.contains("not a valid"))
        );
        assert_eq!(blocks(&ev), vec!["after"]);
        let ev = parse_chunks(&[
            b"---ARIZUKO_OUTPUT_START---\n{\"status\":\"maybe\"}\n---ARIZUKO_OUTPUT_END---",
        ]);
        assert!(matches!(&ev[0], ParseEvent::Invalid { .. }));
    }

    #[test]
    fn end_without_start_and_partial_markers_are_noise() {
        let ev = parse_chunks(&[
            b"---ARIZUKO_OUTPUT_END---\n---ARIZUKO_OUTPUT_STAR\n---ARIZUKO_OUTPUT_START--\n",
        ]);
        assert!(ev.is_empty(), "{ev:?}");
    }

    #[test]
    fn oversize_block_is_dropped_and_parsing_recovers() {
        let mut p = SentinelParser::new(&Markers::default(), 1024);
        let mut out = Vec::new();
        p.feed(
            b"---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"",
            &mut out,
        );
        for _ in 0..100 {
            p.feed(&[b'x'; 100], &mut out);
        }
        assert_eq!(out, vec![ParseEvent::Oversize { limit: 1024 }]);
        assert!(p.buf.capacity() < 4096, "buffer stayed bounded");
        p.feed(b"\"}\n---ARIZUKO_OUTPUT_END---\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"ok\"}\n---ARIZUKO_OUTPUT_END---\n", &mut out);
        assert_eq!(blocks(&out), vec!["ok"]);
    }

    #[test]
    fn noise_is_bounded() {
        let mut p = SentinelParser::new(&Markers::default(), 1024);
        let mut out = Vec::new();
        let noise = vec![b'n'; 64 * 1024];
        for _ in 0..64 {
            p.feed(&noise, &mut out);
        }
        assert!(out.is_empty());
        assert!(p.buf.len() < 64);
        assert_eq!(p.noise_bytes(), 64 * 64 * 1024);
    }

    #[test]
    fn custom_markers() {
        let mut p = SentinelParser::new(&Markers::for_prefix("NANOCLAW"), 1024);
        let mut out = Vec::new();
        p.feed(b"[LOG] x\n---NANOCLAW_OUTPUT_START---\n{\"status\":\"success\",\"result\":\"hi\"}\n---NANOCLAW_OUTPUT_END---\n---ARIZUKO_OUTPUT_START---\n", &mut out);
        assert_eq!(blocks(&out), vec!["hi"]);
        assert!(!p.in_block());
    }

    #[test]
    fn crlf_lines_work() {
        let ev = parse_chunks(&[b"x\r\n---ARIZUKO_OUTPUT_START---\r\n{\"status\":\"ok\",\"result\":\"w\"}\r\n---ARIZUKO_OUTPUT_END---\r\n"]);
        assert_eq!(blocks(&ev), vec!["w"]);
    }
}
