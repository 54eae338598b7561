//! A streamed answer with tools offered: its text goes out as content until a call may start;
//! from there each call goes out in pieces as it is generated (its name once known, then its
//! arguments' text as it comes), and what is left is read as calls at the end.

use super::tools::{AnswerStart, ParsedCall, ToolFormat, Tools, OPEN};

/// What a streamed answer sends next.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamPiece {
    /// Text of the answer.
    Text(String),
    /// Call `index` begins: its function's name, and the call id the model wrote, if it wrote
    /// one (its arguments follow).
    CallStart {
        index: usize,
        name: String,
        id: Option<String>,
    },
    /// More of call `index`'s arguments: the pieces joined are its arguments' JSON text.
    Arguments { index: usize, text: String },
}

/// Where the stream is within the held part of the answer (after a call may have started).
#[derive(Debug, Clone, PartialEq)]
enum Scan {
    /// Between calls: the next `{` starts one.
    Between,
    /// In a call's object, from byte `start`, before its arguments.
    Header { start: usize },
    /// In call `index`'s arguments object; `depth` of nested objects and arrays so far.
    Arguments {
        index: usize,
        depth: usize,
        in_string: bool,
        escaped: bool,
    },
    /// After a call's arguments, until its object closes.
    Closing,
    /// A call in a shape the stream cannot follow: the rest is read at the end.
    Whole,
}

/// A streamed answer's text with tools offered.
#[derive(Debug)]
pub struct ToolStream {
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call has started (or the answer must be calls): nothing more goes out as content.
    holding: bool,
    /// The format: where a call may start.
    format: ToolFormat,
    /// Bytes of the held text scanned for calls so far.
    scanned: usize,
    scan: Scan,
    /// Calls begun in pieces, with the bytes of arguments sent for each.
    streamed: Vec<(String, usize)>,
}

impl ToolStream {
    /// A stream of an answer to `tools`; a forced answer holds everything.
    pub fn new(tools: &Tools) -> Self {
        ToolStream {
            text: String::new(),
            sent: 0,
            holding: tools.forced(),
            format: tools.format(),
            scanned: 0,
            scan: Scan::Between,
            streamed: Vec::new(),
        }
    }

    /// Takes the next piece of text; returns what goes out now: content, then the pieces of
    /// calls that `tools` offers.
    pub fn push(&mut self, piece: &str, tools: &Tools) -> Vec<StreamPiece> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        if !self.holding {
            let text = self.content(tools);
            if !text.is_empty() {
                out.push(StreamPiece::Text(text));
            }
        }
        if self.holding {
            if self.scanned < self.sent {
                self.scanned = self.sent;
            }
            self.scan_calls(tools, &mut out);
        }
        out
    }

    /// The content that can go out now, up to where a call may be starting.
    fn content(&mut self, tools: &Tools) -> String {
        let unsent = &self.text[self.sent..];
        let (until, holding) = match tools.whole_answer_start(unsent.trim_start()) {
            // Calls that are the whole answer: held while the answer may still start them.
            Some(start) => match (self.sent, start) {
                (0, AnswerStart::Undecided) => (0, false),
                (0, AnswerStart::Calls) => (0, true),
                _ => (unsent.len(), false),
            },
            None => match unsent.find(OPEN) {
                Some(i) => (i, true),
                // Hold back an end that may be the start of the tag.
                None => (
                    (1..OPEN.len())
                        .rev()
                        .find(|&k| unsent.ends_with(&OPEN[..k]))
                        .map_or(unsent.len(), |k| unsent.len() - k),
                    false,
                ),
            },
        };
        self.holding = holding;
        let out = unsent[..until].to_string();
        self.sent += until;
        out
    }

    /// Follows the held text from where it was left, queuing the calls' pieces.
    fn scan_calls(&mut self, tools: &Tools, out: &mut Vec<StreamPiece>) {
        while self.scanned < self.text.len() {
            let rest = &self.text[self.scanned..];
            match self.scan.clone() {
                Scan::Whole => return,
                // Mistral's v11 calls: the name (and markers, id) before the arguments' `{`.
                Scan::Between if matches!(self.format, ToolFormat::MistralNamed(_)) => {
                    let Some(open) = rest.find('{') else { return };
                    let Some((name, id)) = tools.named_call(&rest[..open]) else {
                        self.scan = Scan::Whole;
                        continue;
                    };
                    self.scanned += open;
                    self.begin_arguments(name, id, out);
                }
                Scan::Between => match rest.find('{') {
                    Some(i) => {
                        self.scanned += i;
                        self.scan = Scan::Header {
                            start: self.scanned,
                        };
                    }
                    None => self.scanned = self.text.len(),
                },
                Scan::Header { start } => match header(&self.text[start..]) {
                    Header::Incomplete => return,
                    Header::Other => self.scan = Scan::Whole,
                    Header::Done { name, arguments_at } => {
                        if !tools.offers(&name) {
                            self.scan = Scan::Whole;
                            continue;
                        }
                        self.scanned = start + arguments_at;
                        self.begin_arguments(name, None, out);
                    }
                },
                Scan::Arguments { index, .. } => {
                    let (len, done) = arguments_end(&mut self.scan, rest);
                    let text = rest[..len].to_string();
                    self.scanned += len;
                    self.streamed[index].1 += len;
                    if !text.is_empty() {
                        out.push(StreamPiece::Arguments { index, text });
                    }
                    if done {
                        // A v11 call ends with its arguments; the others close their object.
                        self.scan = match self.format {
                            ToolFormat::MistralNamed(_) => Scan::Between,
                            _ => Scan::Closing,
                        };
                    }
                }
                Scan::Closing => match rest.find('}') {
                    Some(i) => {
                        self.scanned += i + 1;
                        self.scan = Scan::Between;
                    }
                    None => self.scanned = self.text.len(),
                },
            }
        }
    }

    /// Call `name` begins, its arguments at the scan's place.
    fn begin_arguments(&mut self, name: String, id: Option<String>, out: &mut Vec<StreamPiece>) {
        let index = self.streamed.len();
        out.push(StreamPiece::CallStart {
            index,
            name: name.clone(),
            id,
        });
        self.streamed.push((name, 0));
        self.scan = Scan::Arguments {
            index,
            depth: 0,
            in_string: false,
            escaped: false,
        };
    }

    /// At the end: what is left to send.
    pub fn finish(self, tools: &Tools) -> Finished {
        let Some((_, calls)) = tools.parse(&self.text) else {
            return match self.streamed.is_empty() {
                true => Finished::Text(self.text[self.sent..].to_string()),
                false => Finished::CutShort,
            };
        };
        let mut out = Vec::new();
        for (
            index,
            ParsedCall {
                name,
                arguments,
                id,
            },
        ) in calls.into_iter().enumerate()
        {
            match self.streamed.get(index) {
                // Begun in pieces: the rest of its arguments, if any.
                Some((_, sent)) => {
                    if let Some(rest) = arguments.get(*sent..).filter(|r| !r.is_empty()) {
                        out.push(StreamPiece::Arguments {
                            index,
                            text: rest.to_string(),
                        });
                    }
                }
                None => {
                    out.push(StreamPiece::CallStart { index, name, id });
                    out.push(StreamPiece::Arguments {
                        index,
                        text: arguments,
                    });
                }
            }
        }
        Finished::Calls(out)
    }
}

/// How a streamed answer with tools ends.
#[derive(Debug, PartialEq)]
pub enum Finished {
    /// It made calls: the pieces of them still to send.
    Calls(Vec<StreamPiece>),
    /// A call went out in part and the answer stopped before it was whole (its token limit):
    /// the pieces sent stand.
    CutShort,
    /// It made no call: the text held back, to send as content.
    Text(String),
}

/// Bytes of `rest` that belong to the arguments object, and whether it closed there.
fn arguments_end(scan: &mut Scan, rest: &str) -> (usize, bool) {
    let Scan::Arguments {
        depth,
        in_string,
        escaped,
        ..
    } = scan
    else {
        return (0, false);
    };
    // JSON's structure is ASCII, and no byte of a longer UTF-8 character is ASCII.
    for (i, b) in rest.bytes().enumerate() {
        if *in_string {
            match (b, *escaped) {
                (_, true) => *escaped = false,
                (b'\\', false) => *escaped = true,
                (b'"', false) => *in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => *in_string = true,
            b'{' | b'[' => *depth += 1,
            b'}' | b']' => {
                *depth = depth.saturating_sub(1);
                if *depth == 0 {
                    return (i + 1, true);
                }
            }
            _ => {}
        }
    }
    (rest.len(), false)
}

/// How far a call's object `{"name": "...", "arguments": {` has come.
#[derive(Debug, PartialEq)]
enum Header {
    /// It may still become one.
    Incomplete,
    /// The name is known and the arguments object starts at byte `arguments_at`.
    Done { name: String, arguments_at: usize },
    /// Some other shape (another key order, arguments as a string, ...).
    Other,
}

/// Reads the start of a call's object: its name first, then `arguments` (or `parameters`,
/// Llama 3.1's key) holding an object, JSON whitespace anywhere between.
fn header(call: &str) -> Header {
    let mut at = 0;
    let skip_space = |at: &mut usize| {
        *at += call[*at..].len()
            - call[*at..]
                .trim_start_matches([' ', '\t', '\n', '\r'])
                .len();
    };
    // Each step: `Some(true)` matched, `Some(false)` cannot match, `None` not written yet.
    let literal = |at: &mut usize, lit: &str| -> Option<bool> {
        let rest = &call[*at..];
        if rest.starts_with(lit) {
            *at += lit.len();
            Some(true)
        } else if lit.starts_with(rest) {
            None
        } else {
            Some(false)
        }
    };
    macro_rules! step {
        ($e:expr) => {
            match $e {
                Some(true) => {}
                Some(false) => return Header::Other,
                None => return Header::Incomplete,
            }
        };
    }
    step!(literal(&mut at, "{"));
    skip_space(&mut at);
    step!(literal(&mut at, "\"name\""));
    skip_space(&mut at);
    step!(literal(&mut at, ":"));
    skip_space(&mut at);
    step!(literal(&mut at, "\""));
    // Function names are letters, digits, `_` and `-`: no escapes to read.
    let Some(len) = call[at..].find(['"', '\\']) else {
        return Header::Incomplete;
    };
    if call[at + len..].starts_with('\\') {
        return Header::Other;
    }
    let name = call[at..at + len].to_string();
    at += len + 1;
    skip_space(&mut at);
    step!(literal(&mut at, ","));
    skip_space(&mut at);
    let key = ["\"arguments\"", "\"parameters\""]
        .iter()
        .map(|k| (k, literal(&mut at.clone(), k)))
        .find(|(_, m)| *m != Some(false));
    match key {
        Some((k, Some(true))) => at += k.len(),
        Some((_, _)) => return Header::Incomplete,
        None => return Header::Other,
    }
    skip_space(&mut at);
    step!(literal(&mut at, ":"));
    skip_space(&mut at);
    step!(literal(&mut at, "{"));
    Header::Done {
        name,
        arguments_at: at - 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::tools::{call_text, Choice};

    fn tools(choice: Choice, format: ToolFormat) -> Tools {
        Tools::two_functions(choice, true, format)
    }

    /// `text` pushed in pieces of `size` bytes (on character boundaries), then finished: every
    /// piece that went out, and how it finished.
    fn pieces(t: &Tools, text: &str, size: usize) -> (Vec<StreamPiece>, Finished) {
        let mut s = ToolStream::new(t);
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut end = size.min(rest.len());
            while !rest.is_char_boundary(end) {
                end += 1;
            }
            pieces.extend(s.push(&rest[..end], t));
            rest = &rest[end..];
        }
        let finished = s.finish(t);
        if let Finished::Calls(more) = &finished {
            pieces.extend(more.iter().cloned());
        }
        (pieces, finished)
    }

    /// [`pieces`]: the content sent, and each call's name and arguments as the pieces join them.
    fn stream(t: &Tools, text: &str, size: usize) -> (String, Vec<(String, String)>, Finished) {
        let (pieces, finished) = pieces(t, text, size);
        let (mut content, mut calls) = (String::new(), Vec::<(String, String)>::new());
        for p in pieces {
            match p {
                StreamPiece::Text(t) => content += &t,
                StreamPiece::CallStart { index, name, .. } => {
                    assert_eq!(index, calls.len(), "calls start in order");
                    calls.push((name, String::new()));
                }
                StreamPiece::Arguments { index, text } => calls[index].1 += &text,
            }
        }
        (content, calls, finished)
    }

    /// [`pieces`]: the ids the calls start with.
    fn streamed_ids(t: &Tools, text: &str, size: usize) -> Vec<Option<String>> {
        let (pieces, _) = pieces(t, text, size);
        pieces
            .into_iter()
            .filter_map(|p| match p {
                StreamPiece::CallStart { id, .. } => Some(id),
                _ => None,
            })
            .collect()
    }

    /// Pieces of any size join to the calls the whole answer parses to, arguments as written
    /// (braces and escaped quotes inside strings, characters of several bytes).
    #[test]
    fn calls_go_out_in_pieces_that_join_to_the_parsed_calls() {
        let t = tools(Choice::Auto, ToolFormat::Generic);
        let args = [
            r#"{"x": 1, "note": "a } and a \" and {[", "deep": {"a": [1, {"b": "é"}]}}"#,
            r#"{"x": 2}"#,
        ];
        let text = format!(
            "Let me check.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {}}}\n</tool_call>\n<tool_call>\n{{\"name\": \"add\", \"arguments\": {}}}\n</tool_call>",
            args[0], args[1]
        );
        let (_, parsed) = t.parse(&text).unwrap();
        let want: Vec<(String, String)> =
            parsed.into_iter().map(|c| (c.name, c.arguments)).collect();
        assert_eq!(want[0].1, args[0], "arguments as written");
        for size in 1..=text.len() {
            let (content, calls, finished) = stream(&t, &text, size);
            assert_eq!(content, "Let me check.\n", "size {size}");
            assert_eq!(calls, want, "size {size}");
            assert_eq!(finished, Finished::Calls(Vec::new()), "all sent in pieces");
        }
    }

    /// Streamed as it is generated: the name as soon as the arguments start, then each piece.
    #[test]
    fn a_call_starts_before_its_arguments_end() {
        let t = tools(Choice::Required, ToolFormat::Tagged);
        let mut s = ToolStream::new(&t);
        assert_eq!(s.push("<tool_call>\n{\"name\": \"ad", &t), []);
        assert_eq!(
            s.push("d\", \"arguments\": {\"x\"", &t),
            [
                StreamPiece::CallStart {
                    index: 0,
                    name: "add".into(),
                    id: None,
                },
                StreamPiece::Arguments {
                    index: 0,
                    text: "{\"x\"".into()
                }
            ]
        );
        let more = s.push(": 4}}\n</tool_call>", &t);
        assert_eq!(
            more,
            [StreamPiece::Arguments {
                index: 0,
                text: ": 4}".into()
            }]
        );
    }

    /// A text answer goes out as text, a `<` that starts no tag once the next piece shows it;
    /// a call in a shape the stream cannot follow goes out whole at the end; a call to a
    /// function not offered is text; a call cut short keeps the pieces sent.
    #[test]
    fn what_cannot_be_streamed_goes_out_at_the_end() {
        let t = tools(Choice::Auto, ToolFormat::Generic);
        let mut s = ToolStream::new(&t);
        let sent: Vec<StreamPiece> = ["a <", "b"].iter().flat_map(|p| s.push(p, &t)).collect();
        assert_eq!(
            sent,
            [
                StreamPiece::Text("a ".into()),
                StreamPiece::Text("<b".into())
            ]
        );
        assert_eq!(s.finish(&t), Finished::Text(String::new()));

        let reordered = "<tool_call>\n{\"arguments\": {\"x\": 5}, \"name\": \"add\"}\n</tool_call>";
        let (content, calls, _) = stream(&t, reordered, 3);
        assert_eq!(content, "");
        assert_eq!(calls, [("add".to_string(), "{\"x\": 5}".to_string())]);

        let unknown = call_text("sub", "{}");
        let (_, calls, finished) = stream(&t, &unknown, 4);
        assert!(calls.is_empty());
        assert_eq!(finished, Finished::Text(unknown));

        let cut = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"x\": 1";
        let (_, calls, finished) = stream(&t, cut, 5);
        assert_eq!(calls, [("add".to_string(), "{\"x\": 1".to_string())]);
        assert_eq!(finished, Finished::CutShort);
    }

    /// Llama 3.1's format: the call is the whole answer, arguments under `parameters`.
    #[test]
    fn a_json_call_streams_too() {
        let t = tools(Choice::Auto, ToolFormat::Json);
        let call = r#"{"name": "add", "parameters": {"x": 2}}"#;
        for size in 1..=call.len() {
            let (content, calls, _) = stream(&t, call, size);
            assert_eq!(content, "");
            assert_eq!(calls, [("add".to_string(), r#"{"x": 2}"#.to_string())]);
        }
        let (content, calls, finished) = stream(&t, " It is {sunny} today", 4);
        assert_eq!(content, " It is {sunny} today");
        assert!(calls.is_empty());
        assert_eq!(finished, Finished::Text(String::new()));
    }

    /// Mistral's format: a list of calls is the whole answer, its marker in the text or not
    /// (a control token is not).
    #[test]
    fn a_mistral_list_streams_call_by_call() {
        for marker in [None, Some(5)] {
            let t = tools(Choice::Auto, ToolFormat::Mistral { marker });
            let list = r#" [{"name": "add", "arguments": {"x": [1]}}, {"name": "get_weather", "arguments": {}}]"#;
            let text = match marker {
                Some(_) => list.to_string(),
                None => format!("[TOOL_CALLS]{list}"),
            };
            let want = [
                ("add".to_string(), r#"{"x": [1]}"#.to_string()),
                ("get_weather".to_string(), "{}".to_string()),
            ];
            for size in 1..=text.len() {
                let (content, calls, finished) = stream(&t, &text, size);
                assert_eq!(
                    (content.as_str(), &calls[..]),
                    ("", &want[..]),
                    "size {size}"
                );
                assert_eq!(finished, Finished::Calls(Vec::new()), "all sent in pieces");
            }
            let (content, calls, _) = stream(&t, "It is [sunny] today", 3);
            assert_eq!(content, "It is [sunny] today");
            assert!(calls.is_empty());
        }
    }

    /// Mistral's v11 and later: calls one after another, each a name and its arguments,
    /// streamed call by call whether the markers are text or control tokens (left out).
    #[test]
    fn mistral_named_calls_stream_call_by_call() {
        let want = [
            ("add".to_string(), r#"{"x": [1]}"#.to_string()),
            ("get_weather".to_string(), "{}".to_string()),
        ];
        for (tokens, ids, text) in [
            (
                false,
                true,
                r#"[TOOL_CALLS]add[CALL_ID]abcdefghi[ARGS]{"x": [1]}[TOOL_CALLS]get_weather[CALL_ID]123456789[ARGS]{}"#,
            ),
            (true, false, r#"add{"x": [1]}get_weather{}"#),
            (
                true,
                true,
                r#"addabcdefghi{"x": [1]}get_weather123456789{}"#,
            ),
        ] {
            let markers = crate::serve::tools::NamedMarkers::for_tests(tokens, ids);
            let t = tools(Choice::Auto, ToolFormat::MistralNamed(markers));
            for size in 1..=text.len() {
                let (content, calls, finished) = stream(&t, text, size);
                assert_eq!(
                    (content.as_str(), &calls[..]),
                    ("", &want[..]),
                    "size {size}: {text}"
                );
                assert_eq!(finished, Finished::Calls(Vec::new()), "all sent in pieces");
                // The model's own call ids go out as the calls' ids.
                let want_ids = match ids {
                    true => vec![Some("abcdefghi".into()), Some("123456789".into())],
                    false => vec![None, None],
                };
                assert_eq!(
                    streamed_ids(&t, text, size),
                    want_ids,
                    "size {size}: {text}"
                );
            }
            for answer in ["added {x} today", "It is {sunny}", "get_weather {}"] {
                let (content, calls, _) = stream(&t, answer, 2);
                assert_eq!((content.as_str(), calls.len()), (answer, 0));
            }
        }
    }

    /// Every prefix of a call's opening may still become one; other shapes are told at once.
    #[test]
    fn the_opening_is_read_at_every_cut() {
        let open = "{ \"name\" : \"get_weather\",\n \"parameters\": {";
        for end in 0..open.len() {
            assert_eq!(
                header(&open[..end]),
                Header::Incomplete,
                "{:?}",
                &open[..end]
            );
        }
        assert_eq!(
            header(open),
            Header::Done {
                name: "get_weather".into(),
                arguments_at: open.len() - 1
            }
        );
        assert_eq!(header("{\"arguments\""), Header::Other);
        assert_eq!(
            header("{\"name\": \"a\", \"arguments\": \"{}\""),
            Header::Other
        );
        assert_eq!(header("{\"name\": \"a\\\"b\""), Header::Other);
    }
}
