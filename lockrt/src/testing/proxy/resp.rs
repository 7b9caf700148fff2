//! A RESP frame splitter for [`FaultProxy`](super::FaultProxy): cuts a byte stream into whole
//! top-level frames, so faults apply per request or per reply, never in the middle of one.
//!
//! It only measures frames; it never interprets or rewrites them. Understood: every RESP2 type
//! (simple strings, errors, integers, bulk strings including the null bulk string, arrays
//! including nested and null arrays), the RESP3 types a server may send after `HELLO 3`
//! (null, boolean, double, big number, blob error, verbatim string, map, set, push, and an
//! attribute, which counts with the frame it precedes), and, in requests, inline commands.
//! Pub/sub messages are push frames: each one counts as one reply. Work per byte is bounded:
//! a frame is re-measured from its start only when more bytes of it arrive.

use std::fmt;

/// Longest bulk string accepted (Redis's own `proto-max-bulk-len` default is 512 MiB).
const MAX_BULK: u64 = 1 << 32;
/// Most elements one aggregate may announce.
const MAX_ELEMENTS: u64 = 1 << 32;

/// Which side's bytes a splitter measures: requests may be inline commands, replies may not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Requests,
    Replies,
}

/// The stream is not RESP (a proxy then forwards the rest of it unmeasured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RespError(String);

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not RESP: {}", self.0)
    }
}

/// Incremental splitter: feed it reads as they come, take whole frames out.
#[derive(Debug)]
pub(crate) struct RespSplitter {
    side: Side,
    buf: Vec<u8>,
}

impl RespSplitter {
    pub(crate) fn new(side: Side) -> RespSplitter {
        RespSplitter {
            side,
            buf: Vec::new(),
        }
    }

    /// Appends `bytes` and moves every frame now complete into `out`, in order. Bytes of an
    /// incomplete frame stay buffered for the next call.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<Vec<u8>>) -> Result<(), RespError> {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while start < self.buf.len() {
            match frame_len(&self.buf[start..], self.side)? {
                Some(n) => {
                    out.push(self.buf[start..start + n].to_vec());
                    start += n;
                }
                None => break,
            }
        }
        self.buf.drain(..start);
        Ok(())
    }

    /// Bytes of an incomplete frame held back so far.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Hands out whatever is buffered (used when the stream turns out not to be RESP).
    pub(crate) fn take_buffered(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Length of the first whole frame of `buf`, `None` if it is not complete yet.
fn frame_len(buf: &[u8], side: Side) -> Result<Option<usize>, RespError> {
    if side == Side::Requests && !is_type_byte(buf[0]) {
        // Inline command: one line, ended by LF (CRLF in practice).
        return Ok(buf.iter().position(|&b| b == b'\n').map(|i| i + 1));
    }
    let mut pos = 0usize;
    // Elements still to read; aggregates add theirs. Flat counting is enough to find the end.
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        let Some(&ty) = buf.get(pos) else {
            return Ok(None);
        };
        let Some(eol) = find_crlf(buf, pos + 1) else {
            return Ok(None);
        };
        let line = &buf[pos + 1..eol];
        pos = eol + 2;
        match ty {
            b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => {}
            b'$' | b'!' | b'=' => match bulk_end(buf, pos, ty, line)? {
                Some(BulkEnd::Null) => {}
                Some(BulkEnd::At(end)) => pos = end,
                None => return Ok(None),
            },
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                pending = pending
                    .checked_add(elements(ty, line)?)
                    .ok_or_else(|| err("aggregate too long".into()))?;
            }
            other => {
                return Err(err(format!(
                    "unexpected type byte {:?} at offset {pos}",
                    char::from(other)
                )));
            }
        }
    }
    Ok(Some(pos))
}

/// Where a bulk string whose header line was `line` ends.
enum BulkEnd {
    Null,
    At(usize),
}

/// The end of the bulk string whose payload starts at `pos`; `None` when not all of it has
/// arrived yet.
fn bulk_end(buf: &[u8], pos: usize, ty: u8, line: &[u8]) -> Result<Option<BulkEnd>, RespError> {
    let n = int(line)?;
    if n == -1 && ty == b'$' {
        return Ok(Some(BulkEnd::Null));
    }
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n as u64 <= MAX_BULK)
        .ok_or_else(|| err(format!("bulk length {n}")))?;
    let end = pos
        .checked_add(n)
        .and_then(|e| e.checked_add(2))
        .ok_or_else(|| err(format!("bulk length {n}")))?;
    if buf.len() < end {
        return Ok(None);
    }
    if &buf[end - 2..end] != b"\r\n" {
        return Err(err("bulk string not followed by CRLF".into()));
    }
    Ok(Some(BulkEnd::At(end)))
}

/// How many elements an aggregate whose header line was `line` adds (0 for a null array).
fn elements(ty: u8, line: &[u8]) -> Result<u64, RespError> {
    let n = int(line)?;
    if n == -1 && ty == b'*' {
        return Ok(0);
    }
    let n = u64::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| err(format!("aggregate length {n}")))?;
    match ty {
        b'%' => n.checked_mul(2),
        // An attribute map, then the frame it describes.
        b'|' => n.checked_mul(2).and_then(|m| m.checked_add(1)),
        _ => Some(n),
    }
    .ok_or_else(|| err(format!("aggregate length {n}")))
}

fn is_type_byte(b: u8) -> bool {
    b"+-:$*_#,(!=%~>|".contains(&b)
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

fn int(line: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err(format!("bad length {:?}", String::from_utf8_lossy(line))))
}

fn err(msg: String) -> RespError {
    RespError(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(side: Side, chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>, RespError> {
        let mut s = RespSplitter::new(side);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out)?;
        }
        assert_eq!(s.buffered(), 0, "bytes left over");
        Ok(out)
    }

    const REPLIES: &[&[u8]] = &[
        b"+OK\r\n",
        b"-ERR wrong\r\n",
        b":-42\r\n",
        b"$5\r\nhe\r\no\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n*-1\r\n$-1\r\n",
        b"*2\r\n*1\r\n*1\r\n+deep\r\n:7\r\n",
        // A pub/sub message as RESP2 delivers it.
        b"*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$2\r\nhi\r\n",
        // RESP3: push, map, set, attribute + its frame, scalars, blob error, verbatim.
        b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
        b"%2\r\n+a\r\n:1\r\n+b\r\n_\r\n",
        b"~2\r\n#t\r\n,1.5\r\n",
        b"|1\r\n+ttl\r\n:3\r\n+value\r\n",
        b"(12345678901234567890\r\n",
        b"!3\r\nbad\r\n",
        b"=7\r\ntxt:abc\r\n",
    ];

    #[test]
    fn every_reply_type_is_one_frame() {
        for r in REPLIES {
            assert_eq!(
                split(Side::Replies, &[r]).unwrap(),
                vec![r.to_vec()],
                "{r:?}"
            );
        }
    }

    #[test]
    fn pipelined_frames_in_one_read_come_out_in_order() {
        let all: Vec<u8> = REPLIES.concat();
        let frames = split(Side::Replies, &[&all]).unwrap();
        let want: Vec<Vec<u8>> = REPLIES.iter().map(|r| r.to_vec()).collect();
        assert_eq!(frames, want);
    }

    #[test]
    fn frames_split_across_reads_at_every_byte_come_out_whole() {
        let all: Vec<u8> = REPLIES.concat();
        let want: Vec<Vec<u8>> = REPLIES.iter().map(|r| r.to_vec()).collect();
        // One byte per read.
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        assert_eq!(split(Side::Replies, &bytes).unwrap(), want);
        // Every two-way cut of the whole stream.
        for cut in 0..=all.len() {
            let (a, b) = all.split_at(cut);
            assert_eq!(split(Side::Replies, &[a, b]).unwrap(), want, "cut at {cut}");
        }
    }

    #[test]
    fn nothing_comes_out_before_a_frame_is_complete() {
        let mut s = RespSplitter::new(Side::Replies);
        let mut out = Vec::new();
        // A bulk string whose payload contains CRLF and a type byte must not end early.
        s.push(b"*2\r\n$4\r\n+\r\n:", &mut out).unwrap();
        assert!(out.is_empty());
        s.push(b"\r\n:1\r", &mut out).unwrap();
        assert!(out.is_empty());
        s.push(b"\n+next", &mut out).unwrap();
        assert_eq!(out, vec![b"*2\r\n$4\r\n+\r\n:\r\n:1\r\n".to_vec()]);
        assert_eq!(s.buffered(), 5);
    }

    #[test]
    fn requests_may_be_arrays_or_inline() {
        let frames = split(
            Side::Requests,
            &[b"*2\r\n$4\r\nECHO\r\n$1\r\nx\r\nPING\r\nPI", b"NG\n"],
        )
        .unwrap();
        assert_eq!(
            frames,
            vec![
                b"*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n".to_vec(),
                b"PING\r\n".to_vec(),
                b"PING\n".to_vec()
            ]
        );
    }

    #[test]
    fn garbage_is_reported_not_guessed() {
        assert!(split(Side::Replies, &[b"PONG\r\n"]).is_err());
        assert!(split(Side::Replies, &[b"$3\r\nabcd\r\n"]).is_err());
        assert!(split(Side::Replies, &[b"$-2\r\n"]).is_err());
        assert!(split(Side::Replies, &[b"*x\r\n"]).is_err());
        assert!(split(Side::Replies, &[b"*9223372036854775807\r\n"]).is_err());
        assert!(split(Side::Replies, &[b"$99999999999\r\n"]).is_err());
    }
}
