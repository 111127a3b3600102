"""The WebSocket channel framing of Kubernetes streaming (k8s.io/apimachinery wsstream).

Binary protocols (`channel.k8s.io`, `v4.channel.k8s.io`, `v5.channel.k8s.io`): each binary
message is one channel byte followed by the payload. Base64 protocols (`base64.channel.k8s.io`,
`v4.base64.channel.k8s.io`): each text message is the channel as an ASCII digit followed by the
base64 of the payload. Channel 255 (v5 only, binary) carries control: `[255, n]` closes channel n.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from aiohttp import WSMessage, WSMsgType, web


@dataclass(frozen=True)
class ChannelCodec:
    protocol: str

    @property
    def base64(self) -> bool:
        return "base64." in self.protocol

    @property
    def status_is_json(self) -> bool:
        """v4 and later send a Status object on the error channel; older ones plain text."""
        return self.protocol.startswith(("v4.", "v5."))

    @property
    def has_close_signal(self) -> bool:
        return self.protocol.startswith("v5.")

    def decode(self, msg: WSMessage) -> tuple[int, bytes] | None:
        """(channel, payload) of a client message, or None for anything else."""
        if msg.type == WSMsgType.BINARY and not self.base64 and msg.data:
            return msg.data[0], bytes(msg.data[1:])
        if msg.type == WSMsgType.TEXT and self.base64 and msg.data:
            text: str = msg.data
            if not text[0].isdigit():
                return None
            try:
                return int(text[0]), base64.b64decode(text[1:], validate=True)
            except (binascii.Error, ValueError):
                return None
        return None

    async def send(self, ws: web.WebSocketResponse, channel: int, data: bytes) -> None:
        if self.base64:
            await ws.send_str(str(channel) + base64.b64encode(data).decode())
        else:
            await ws.send_bytes(bytes([channel]) + data)
