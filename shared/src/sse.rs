//! A server-sent events parser: bytes in, in whatever pieces they arrive, events out.
//!
//! `event:` names the event, `data:` lines are joined by `\n`, a blank line ends the event,
//! comments (`:`) and other fields are ignored; `\n` and `\r\n` both end lines. A line longer
//! than the bound is an error, so a broken peer cannot make a reader buffer forever. The one
//! reader of event streams: the agent's of its model, routd's of runed's run events, the
//! CLI's of routd's chats and runed's runs.

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` (empty when absent).
    pub name: String,
    /// The `data:` lines, joined.
    pub data: String,
}

/// A line or an event outgrew the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an event stream line or event longer than {0} bytes")]
pub struct TooLong(pub usize);

/// The parser's state between pieces.
#[derive(Debug)]
pub struct Parser {
    max: usize,
    line: Vec<u8>,
    name: String,
    data: String,
    has_data: bool,
}

impl Parser {
    /// A parser bounding each line and each event's data to `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            line: Vec::new(),
            name: String::new(),
            data: String::new(),
            has_data: false,
        }
    }

    /// Feeds a piece; complete events are pushed to `out`.
    pub fn feed(&mut self, mut piece: &[u8], out: &mut Vec<Event>) -> Result<(), TooLong> {
        while let Some(nl) = memchr::memchr(b'\n', piece) {
            if self.line.len() + nl > self.max {
                return Err(TooLong(self.max));
            }
            self.line.extend_from_slice(&piece[..nl]);
            piece = &piece[nl + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.field(&line, out)?;
            line.clear();
            self.line = line;
        }
        if self.line.len() + piece.len() > self.max {
            return Err(TooLong(self.max));
        }
        self.line.extend_from_slice(piece);
        Ok(())
    }

    fn field(&mut self, line: &[u8], out: &mut Vec<Event>) -> Result<(), TooLong> {
        if line.is_empty() {
            if self.has_data || !self.name.is_empty() {
                out.push(Event {
                    name: std::mem::take(&mut self.name),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.has_data = false;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (key, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match key {
            b"event" => self.name = value.into_owned(),
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                if self.data.len() + value.len() > self.max {
                    return Err(TooLong(self.max));
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\nevent: delta\r\ndata: line1\r\ndata: line2\r\n\r\ndata: [DONE]\n\n";

    fn all(piece: usize) -> Vec<Event> {
        let mut p = Parser::new(1024);
        let mut out = Vec::new();
        for c in STREAM.as_bytes().chunks(piece) {
            p.feed(c, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn events_whatever_the_pieces() {
        let want = vec![
            Event {
                name: "message_start".into(),
                data: "{\"a\":1}".into(),
            },
            Event {
                name: "delta".into(),
                data: "line1\nline2".into(),
            },
            Event {
                name: String::new(),
                data: "[DONE]".into(),
            },
        ];
        for piece in 1..=STREAM.len() {
            assert_eq!(all(piece), want, "pieces of {piece}");
        }
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut p = Parser::new(16);
        let mut out = Vec::new();
        p.feed(b"data: 0123456789", &mut out).unwrap();
        assert_eq!(p.feed(b"abcdef", &mut out), Err(TooLong(16)));
    }
}
