//! The protobuf codec of toolgate's gRPC services and clients: prost's,
//! with buffers sized for toolgate's messages.
//!
//! tonic's default codec starts every call's read buffer and write buffer
//! at 8 KiB. toolgate's requests and answers are a few hundred bytes, and
//! a profile of a Dispatch round showed those two fresh 8 KiB buffers per
//! call costing a tenth of the server's CPU in page faults (the allocator
//! hands out fresh pages for them faster than it reuses freed ones). A
//! buffer still grows to any message up to the size limit; only its first
//! allocation is smaller.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The initial size of a call's read and write buffers.
pub const BUFFER_SIZE: usize = 1024;
/// How much a streamed answer buffers before it yields (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD)
}

/// [`tonic_prost::ProstCodec`] with [`BUFFER_SIZE`] buffers; the generated
/// services and clients of [`crate::pb`] use it.
#[derive(Debug)]
pub struct ProtoCodec<T, U>(PhantomData<fn(T) -> U>);

impl<T, U> Default for ProtoCodec<T, U> {
    fn default() -> Self {
        ProtoCodec(PhantomData)
    }
}

impl<T, U> Codec for ProtoCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}

#[cfg(test)]
mod tests {
    use tonic::codec::{Decoder as _, Encoder as _};

    use super::*;

    #[test]
    fn both_directions_start_at_buffer_size() {
        // BufferSettings keeps its fields private; its Debug shows them.
        let expected = format!("buffer_size: {BUFFER_SIZE},");
        let mut codec =
            ProtoCodec::<crate::pb::DecideRequest, crate::pb::DecideResponse>::default();
        let encoder = format!("{:?}", codec.encoder().buffer_settings());
        let decoder = format!("{:?}", codec.decoder().buffer_settings());
        assert!(encoder.contains(&expected), "{encoder}");
        assert!(decoder.contains(&expected), "{decoder}");
    }
}
