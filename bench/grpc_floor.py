"""The gRPC floor of ``bench.keda``: grpc.aio serving ``externalscaler.ExternalScaler`` with the
adapter's server options, answering every ``GetMetrics`` and ``IsActive`` with a constant and doing
nothing else. Its CPU per call is what gRPC costs on this machine at that moment; the adapter's CPU
per call minus it is the adapter's own work.

``python -m bench.grpc_floor PORT VALUE``
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc

from adapter.config.settings import ScalerSettings
from adapter.serving.keda import externalscaler_pb2 as pb
from adapter.serving.keda import externalscaler_pb2_grpc as pb_grpc
from adapter.serving.keda.grpcserver import server_options


class Constant(pb_grpc.ExternalScalerServicer):
    def __init__(self, value: float) -> None:
        self.value = value

    async def GetMetrics(self, request: Any, context: Any) -> Any:
        return pb.GetMetricsResponse(
            metricValues=[pb.MetricValue(metricName=request.metricName, metricValueFloat=self.value)]
        )

    async def IsActive(self, request: Any, context: Any) -> Any:
        return pb.IsActiveResponse(result=True)


async def serve(port: int, value: float) -> None:
    server = grpc.aio.server(options=server_options(ScalerSettings(host="127.0.0.1", port=port)))
    pb_grpc.add_ExternalScalerServicer_to_server(Constant(value), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), float(sys.argv[2])))
