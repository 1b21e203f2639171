// Live updates: GET /api/v1/events (server-sent events from the bus, through the entry
// point). Read with fetch rather than EventSource, which cannot send the bearer token.
import { api } from "./api";

export type Kind = "topology" | "paths" | "health" | "failover" | "applied" | "overflow";
export type OnEvent = (kind: Kind, data: Record<string, unknown>) => void;

const RETRY_MS = 2000;

/** Parse one chunk of an SSE stream; returns what is left of an unfinished line. */
export function parse(buffer: string, onEvent: OnEvent, state: { kind: string }): string {
  let newline: number;
  while ((newline = buffer.indexOf("\n")) >= 0) {
    const line = buffer.slice(0, newline).replace(/\r$/, "");
    buffer = buffer.slice(newline + 1);
    if (line.startsWith("event:")) {
      state.kind = line.slice(6).trim();
    } else if (line.startsWith("data:")) {
      try {
        onEvent(state.kind as Kind, JSON.parse(line.slice(5)));
      } catch {
        // not JSON: not one of ours; skip it
      }
    } else if (line === "") {
      state.kind = "message";
    }
  }
  return buffer;
}

/** Follow the stream until `signal` aborts, reconnecting after a break. */
export async function follow(
  onEvent: OnEvent,
  onLive: (live: boolean) => void,
  signal: AbortSignal,
): Promise<void> {
  while (!signal.aborted) {
    try {
      const { response } = await api.GET("/api/v1/events", {
        parseAs: "stream",
        headers: { Accept: "text/event-stream" },
        signal,
      });
      if (response.ok && response.body) {
        onLive(true);
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        const state = { kind: "message" };
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer = parse(buffer + value, onEvent, state);
        }
      }
    } catch {
      // dropped or refused: say so and try again
    }
    onLive(false);
    if (!signal.aborted) await new Promise((r) => setTimeout(r, RETRY_MS));
  }
}
