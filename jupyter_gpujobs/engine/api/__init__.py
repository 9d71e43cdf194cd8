"""The engine's REST API and websocket (tornado handlers under `gpujobs/api/`) and its OpenAPI spec."""
