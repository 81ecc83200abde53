//! The wire format: every frame is a 11-byte header (magic, kind, stream id, payload length,
//! big-endian) followed by the payload.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::ChanError;

/// First two bytes of every frame; a mismatch means the byte stream lost alignment.
pub const MAGIC: u16 = 0xB17E;
pub const HEADER_LEN: usize = 11;
/// Largest payload a frame may carry (a DATA frame is cut to this size).
pub const MAX_PAYLOAD: usize = 32 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Host → guest, stream 0, payload: an 8-byte session id. A new host session: the guest
    /// drops every stream of the previous one.
    Hello = 1,
    /// Host → guest: open a stream to the agent.
    Open = 2,
    /// Guest → host: the stream is connected.
    OpenOk = 3,
    /// Guest → host: the stream could not be connected; payload: the reason (UTF-8).
    Refuse = 4,
    /// Payload bytes of a stream.
    Data = 5,
    /// Payload: u32, bytes the receiver consumed; the sender may send that many more.
    Credit = 6,
    /// The sender will send no more data on this stream (half close).
    Eof = 7,
    /// The stream is aborted in both directions.
    Close = 8,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Open,
            3 => Kind::OpenOk,
            4 => Kind::Refuse,
            5 => Kind::Data,
            6 => Kind::Credit,
            7 => Kind::Eof,
            8 => Kind::Close,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub stream: u32,
    pub payload: Bytes,
}

impl Frame {
    pub fn new(kind: Kind, stream: u32, payload: impl Into<Bytes>) -> Frame {
        Frame {
            kind,
            stream,
            payload: payload.into(),
        }
    }

    pub fn credit(stream: u32, n: u32) -> Frame {
        Frame::new(Kind::Credit, stream, n.to_be_bytes().to_vec())
    }

    /// The credit a [`Kind::Credit`] frame grants.
    pub fn credit_amount(&self) -> Option<u32> {
        let b: [u8; 4] = self.payload.as_ref().try_into().ok()?;
        Some(u32::from_be_bytes(b))
    }

    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(HEADER_LEN + self.payload.len());
        out.put_u16(MAGIC);
        out.put_u8(self.kind as u8);
        out.put_u32(self.stream);
        out.put_u32(self.payload.len() as u32);
        out.put_slice(&self.payload);
    }

    /// Takes one complete frame off the front of `buf`, or `None` when more bytes are needed.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, ChanError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut h = &buf[..HEADER_LEN];
        let magic = h.get_u16();
        let kind = h.get_u8();
        let stream = h.get_u32();
        let len = h.get_u32() as usize;
        if magic != MAGIC {
            return Err(ChanError::Desync(format!("bad magic {magic:#06x}")));
        }
        let kind = Kind::from_u8(kind)
            .ok_or_else(|| ChanError::Desync(format!("unknown frame kind {kind}")))?;
        if len > MAX_PAYLOAD {
            return Err(ChanError::Desync(format!("payload of {len} bytes")));
        }
        if buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        buf.advance(HEADER_LEN);
        let payload = buf.split_to(len).freeze();
        Ok(Some(Frame {
            kind,
            stream,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_wait_for_complete_input() {
        let frames = [
            Frame::new(Kind::Hello, 0, vec![1, 2, 3, 4, 5, 6, 7, 8]),
            Frame::new(Kind::Data, 7, vec![9; 1000]),
            Frame::credit(7, 4096),
            Frame::new(Kind::Eof, 7, Bytes::new()),
        ];
        let mut wire = BytesMut::new();
        for f in &frames {
            f.encode(&mut wire);
        }
        // Fed one byte at a time, the decoder yields exactly the frames, in order.
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = Frame::decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert_eq!(got[2].credit_amount(), Some(4096));
        assert!(buf.is_empty());
    }

    #[test]
    fn garbage_is_a_desync() {
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        assert!(matches!(Frame::decode(&mut buf), Err(ChanError::Desync(_))));
        let mut big = BytesMut::new();
        Frame::new(Kind::Data, 1, Bytes::new()).encode(&mut big);
        big[7..11].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
        assert!(matches!(Frame::decode(&mut big), Err(ChanError::Desync(_))));
    }
}
