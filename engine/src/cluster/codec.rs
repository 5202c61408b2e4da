//! How idem's part of a plan crosses the wire to Ballista's scheduler and executors:
//! [`IdemSinkExec`] as its JSON spec, idem's UDFs by name; everything else as
//! Ballista encodes it.

use std::sync::Arc;

use ballista_core::serde::BallistaPhysicalExtensionCodec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::ScalarUDF;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use super::sink::{IdemSinkExec, SinkSpec};

/// Marks an encoded [`IdemSinkExec`] (Ballista's own nodes are protobuf messages).
const SINK: &[u8] = b"idem-sink:";

/// Ballista's physical codec with idem's sink and UDFs.
#[derive(Debug, Default)]
pub struct IdemCodec {
    ballista: BallistaPhysicalExtensionCodec,
}

/// idem's scalar functions, which a plan may carry to an executor.
pub(crate) fn udfs() -> Vec<ScalarUDF> {
    vec![
        crate::key::IdemKey::udf(),
        crate::key::DedupeUnique::udf(),
        crate::route::PartitionOf::udf(),
        crate::utc_date::UtcDate::udf(),
    ]
}

impl PhysicalExtensionCodec for IdemCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(spec) = buf.strip_prefix(SINK) else {
            return self.ballista.try_decode(buf, inputs, ctx, proto_converter);
        };
        let spec: SinkSpec = serde_json::from_slice(spec)
            .map_err(|e| DataFusionError::Internal(format!("idem's sink does not decode: {e}")))?;
        match inputs {
            [input] => Ok(Arc::new(IdemSinkExec::new(Arc::clone(input), spec))),
            _ => Err(DataFusionError::Internal(
                "idem's sink has one input".into(),
            )),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        match node.downcast_ref::<IdemSinkExec>() {
            Some(sink) => {
                buf.extend_from_slice(SINK);
                serde_json::to_writer(buf, sink.spec())
                    .map_err(|e| DataFusionError::Internal(format!("idem's sink: {e}")))
            }
            None => self.ballista.try_encode(node, buf, proto_converter),
        }
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        match udfs().into_iter().find(|f| f.name() == name) {
            Some(f) => Ok(Arc::new(f)),
            None => self.ballista.try_decode_udf(name, buf),
        }
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.ballista.try_encode_udf(node, buf)
    }
}
