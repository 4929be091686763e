// The page's one WebSocket to the daemon: JSON-RPC calls and subscriptions that survive
// reconnects. Only the public API (README, "The API"); the browser's session cookie
// authenticates the upgrade.
//
// - call(method, params) resolves with the result or rejects with an RpcError
//   ({code, message, data}); a call cut by a lost connection rejects with code
//   "disconnected" (mutating calls carry a command_id, so the caller may retry).
// - subscribe(method, params, handler) keeps a subscription across reconnects: after one it
//   subscribes again with after_sequence = the last seq it processed, so the daemon
//   replays what was missed (or sends a snapshot when the gap is too large). The handler
//   gets onSnapshot(merged), onEvent(data, seq), onSynced(), onResync(), onValue(data).
// - snapshot(params): thread.snapshot over the socket (its chunks, merged).
// - Reconnects back off from 250 ms to 5 s. A socket refused at once is asked about at
//   /api/auth/session: a 401 there means the session ended, and onSignedOut runs instead.

const CALL_TIMEOUT_MS = 30000;
const MAX_BACKOFF_MS = 5000;

export class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

/** Concatenate the lists of snapshot chunks; head fields come from the first chunk. */
export function mergeChunks(chunks) {
  const merged = {};
  for (const chunk of chunks) {
    for (const [key, value] of Object.entries(chunk)) {
      if (Array.isArray(value)) {
        if (merged[key]) for (const v of value) merged[key].push(v);
        else merged[key] = value.slice();
      } else if (!(key in merged)) merged[key] = value;
    }
  }
  return merged;
}

class Subscription {
  constructor(rpc, method, params, handler) {
    this.rpc = rpc;
    this.method = method;
    this.params = params;
    this.handler = handler;
    this.sub = null; // the server's id, per connection
    this.seq = null; // the last seq processed (snapshot.end, synced, event)
    this.chunks = [];
    this.closed = false;
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.rpc._forget(this);
  }
}

export class Rpc {
  constructor({ url, onState, onSignedOut }) {
    this.url = url;
    this.onState = onState || (() => {});
    this.onSignedOut = onSignedOut || (() => {});
    this.ws = null;
    this.nextId = 1;
    this.pending = new Map(); // id -> {resolve, reject, timer, chunks}
    this.subs = new Set();
    this.byServerId = new Map();
    this.backoff = 250;
    this.stopped = false;
    this.everOpened = false;
    this.state = "connecting";
    this.replies = []; // the last subscribe replies ({method, base}), for tests and the curious
    this.resyncing = new Set(); // subscriptions between a resync and its snapshot's end
  }

  start() {
    this.stopped = false;
    this._connect();
  }

  stop() {
    this.stopped = true;
    if (this.ws) this.ws.close(1000, "signed out");
  }

  _setState(state) {
    this.state = state;
    this.onState(state);
  }

  _connect() {
    if (this.stopped) return;
    this._setState(this.everOpened ? "reconnecting" : "connecting");
    let opened = false;
    if (!this.everOpened) performance.mark("t3d:ws-create");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onopen = () => {
      if (!this.everOpened) performance.mark("t3d:ws-open");
      opened = true;
      this.everOpened = true;
      this.backoff = 250;
      this._setState("live");
      for (const sub of this.subs) this._sendSubscribe(sub);
    };
    ws.onmessage = (event) => this._receive(event.data);
    ws.onclose = () => {
      if (this.ws === ws) this.ws = null;
      this.byServerId.clear();
      this._gone = this._early = null; // server ids are the connection's
      this.resyncing.clear();
      for (const sub of this.subs) {
        sub.sub = null;
        sub.chunks = [];
      }
      for (const [id, waiter] of this.pending) {
        clearTimeout(waiter.timer);
        waiter.reject(new RpcError("disconnected", "the connection to the daemon was lost; try again"));
        this.pending.delete(id);
      }
      if (this.stopped) return;
      this._setState("reconnecting");
      this._afterClose(opened);
    };
  }

  async _afterClose(opened) {
    // A socket that never opened may have been refused for want of a session: ask.
    if (!opened) {
      try {
        const answer = await fetch("/api/auth/session", { credentials: "same-origin", cache: "no-store" });
        if (answer.status === 401) {
          this.stopped = true;
          this._setState("signed-out");
          this.onSignedOut();
          return;
        }
      } catch {
        // the daemon is down: keep trying
      }
    }
    const delay = this.backoff * (0.75 + Math.random() * 0.5);
    this.backoff = Math.min(MAX_BACKOFF_MS, this.backoff * 2);
    setTimeout(() => this._connect(), delay);
  }

  _send(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  /** One JSON-RPC call; a promise of its result. */
  call(method, params = {}, { timeout = CALL_TIMEOUT_MS } = {}) {
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RpcError("timeout", `the daemon did not answer ${method} within ${timeout / 1000} s`));
      }, timeout);
      this.pending.set(id, { resolve, reject, timer, chunks: null });
      if (!this._send({ jsonrpc: "2.0", id, method, params })) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(new RpcError("disconnected", "not connected to the daemon; it reconnects by itself, try again in a moment"));
      }
    });
  }

  /** thread.snapshot (streamed as snapshot.chunk notifications, then {sequence, chunks}). */
  snapshot(params) {
    return this.call("thread.snapshot", params);
  }

  subscribe(method, params, handler) {
    const sub = new Subscription(this, method, params, handler);
    this.subs.add(sub);
    this._sendSubscribe(sub);
    return sub;
  }

  _sendSubscribe(sub) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    const params = { ...sub.params };
    if (sub.seq !== null && sub.method !== "subscribe.server") params.after_sequence = sub.seq;
    sub.chunks = [];
    this.call(sub.method, params).then(
      (result) => {
        if (sub.closed) {
          if (this._early) this._early.delete(result.sub);
          this.call("unsubscribe", { sub: result.sub }).catch(() => {});
          return;
        }
        sub.sub = result.sub;
        this.byServerId.set(result.sub, sub);
        this.replies.push({ method: sub.method, base: result.base });
        if (this.replies.length > 50) this.replies.shift();
        if (sub.handler.onReply) sub.handler.onReply(result);
        // Notifications that came before this reply was handled were kept: deliver them.
        const early = this._early && this._early.get(result.sub);
        if (early) {
          this._early.delete(result.sub);
          for (const params of early) this._deliver(sub, params);
        }
      },
      (error) => {
        if (sub.closed || error.code === "disconnected") return;
        if (sub.handler.onError) sub.handler.onError(error);
      },
    );
  }

  _resynced(sub) {
    if (this.resyncing.delete(sub) && this.resyncing.size === 0 && this.state === "resyncing") this._setState("live");
  }

  _forget(sub) {
    this._resynced(sub);
    this.subs.delete(sub);
    if (sub.sub !== null) {
      this.byServerId.delete(sub.sub);
      this._gone ||= new Set(); // the last 64 forgotten ids: their late frames are dropped
      this._gone.add(sub.sub);
      if (this._gone.size > 64) this._gone.delete(this._gone.values().next().value);
      if (this._early) this._early.delete(sub.sub);
      this.call("unsubscribe", { sub: sub.sub }).catch(() => {});
    }
  }

  _receive(raw) {
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    if (message.method === "sub") {
      const params = message.params;
      const sub = this.byServerId.get(params.sub);
      if (sub) this._deliver(sub, params);
      else this._keepEarly(params);
      return;
    }
    if (message.method === "snapshot.chunk") {
      const waiter = this.pending.get(message.params.id);
      if (waiter) (waiter.chunks ||= []).push(message.params.data);
      return;
    }
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    clearTimeout(waiter.timer);
    if (message.error) {
      waiter.reject(new RpcError(message.error.code, message.error.message, message.error.data));
    } else if (waiter.chunks) {
      waiter.resolve(mergeChunks(waiter.chunks));
    } else {
      waiter.resolve(message.result);
    }
  }

  // The reply to a subscribe resolves a promise, whose callback runs after the frames that
  // followed it in the same task; hold a subscription's frames until its reply is handled.
  // Only a subscription still waiting for its reply can own them: the frames of one this
  // page has forgotten (sent before the server took its unsubscribe) are dropped.
  _keepEarly(params) {
    if (this._gone && this._gone.has(params.sub)) return;
    let waiting = false;
    for (const sub of this.subs) if (sub.sub === null) waiting = true;
    if (!waiting) return;
    this._early ||= new Map();
    const list = this._early.get(params.sub) || [];
    if (list.length < 10000) list.push(params);
    this._early.set(params.sub, list);
    if (this._early.size > 64) this._early.delete(this._early.keys().next().value);
  }

  _deliver(sub, params) {
    const handler = sub.handler;
    switch (params.kind) {
      case "snapshot.chunk":
        sub.chunks.push(params.data);
        break;
      case "snapshot.end": {
        const merged = mergeChunks(sub.chunks);
        sub.chunks = [];
        sub.seq = params.seq;
        if (handler.onSnapshot) handler.onSnapshot(merged);
        this._resynced(sub);
        break;
      }
      case "event":
        if (sub.seq !== null && params.seq <= sub.seq) break; // already seen
        sub.seq = params.seq;
        if (handler.onEvent) handler.onEvent(params.data, params.seq);
        break;
      case "synced":
        sub.seq = params.seq;
        if (handler.onSynced) handler.onSynced(params.data);
        break;
      case "resync":
        sub.chunks = [];
        this.resyncing.add(sub);
        if (this.state === "live") this._setState("resyncing");
        if (handler.onResync) handler.onResync(params.data);
        break;
      default:
        if (handler.onValue) handler.onValue(params.data, params.kind);
    }
  }
}
