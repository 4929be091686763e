// Small pure helpers: DOM building, formatting, ids. No state.

/** An element: h("div", {class: "x", onclick: f}, child, "text", ...). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
      else if (key === "class") el.className = value;
      else if (key === "text") el.textContent = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** A client-minted command_id (any unique string). */
export function newId() {
  if (globalThis.crypto && crypto.randomUUID) return crypto.randomUUID().replaceAll("-", "");
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

const UNITS = [
  [86400 * 365, "y"],
  [86400 * 30, "mo"],
  [86400 * 7, "w"],
  [86400, "d"],
  [3600, "h"],
  [60, "min"],
];

/** "just now", "5 min ago", "3 d ago" for a time in epoch seconds. */
export function ago(seconds, now = Date.now() / 1000) {
  if (typeof seconds !== "number") return "never";
  const delta = Math.max(0, now - seconds);
  if (delta < 45) return "just now";
  for (const [size, unit] of UNITS) {
    if (delta >= size) return `${Math.floor(delta / size)} ${unit} ago`;
  }
  return `${Math.max(1, Math.round(delta / 60))} min ago`;
}

export function absoluteTime(seconds) {
  if (typeof seconds !== "number") return "";
  return new Date(seconds * 1000).toLocaleString();
}

export function duration(seconds) {
  if (typeof seconds !== "number" || !isFinite(seconds)) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const m = Math.floor(seconds / 60);
  return `${m} min ${Math.round(seconds - m * 60)} s`;
}

export function bytes(n) {
  if (typeof n !== "number") return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n >= 10 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
}

export const QUEUE_REASONS = {
  thread_busy: "behind the thread's open turn",
  max_active_turns: "the daemon's cap on running turns",
  loop_saturated: "the daemon is busy",
  memory_pressure: "memory pressure",
};

/** "queued (memory pressure)" and the like. */
export function statusText(status, reason) {
  if (status === "queued" && reason) return `queued: ${QUEUE_REASONS[reason] || reason}`;
  if (status === "waiting") return "waiting for you";
  return status || "?";
}

export function projectName(project) {
  if (!project) return "?";
  if (project.title) return project.title;
  const parts = String(project.path || "").split("/").filter(Boolean);
  return parts[parts.length - 1] || project.path || project.id;
}

export function threadTitle(thread) {
  return (thread && thread.title) || `Untitled ${String(thread && thread.id).slice(0, 8)}`;
}

/** The value at a path (["data", "result"]) in an entity, or undefined. */
export function valueAt(entity, path) {
  let value = entity;
  for (const step of path) {
    if (value === null || typeof value !== "object") return undefined;
    value = value[step];
  }
  return value;
}

/** What a tool call is about in a few words: its file, command or pattern. */
export function toolArgument(data) {
  const input = (data && data.input) || {};
  for (const key of ["file_path", "path", "command", "pattern", "url", "query", "description"]) {
    if (typeof input[key] === "string" && input[key]) return input[key];
  }
  const first = Object.values(input).find((v) => typeof v === "string" && v);
  return first || "";
}

export function shorten(text, max) {
  text = String(text ?? "");
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

export function pretty(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export function isTyping(target) {
  if (!target || !(target instanceof Element)) return false;
  return target.closest("input, textarea, select, [contenteditable=''], [contenteditable='true']") !== null;
}
