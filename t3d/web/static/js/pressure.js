// Memory pressure (subscribe.server {memory_pressure: true}): while the level is severe, a
// banner names the heaviest agents, with links to their threads and a force stop each.
// Elevated shows a quiet line; none shows nothing.

import { forceStop } from "./thread.js";
import { bytes, h, threadTitle } from "./util.js";

export class PressureBanner {
  constructor({ root, rpc, list, ui }) {
    this.root = root;
    this.rpc = rpc;
    this.list = list;
    this.ui = ui;
    this.value = { level: "none", agents: [] };
    this.root.hidden = true;
  }

  start() {
    this.sub = this.rpc.subscribe("subscribe.server", { memory_pressure: true }, {
      onValue: (value, kind) => {
        if (kind === "memory_pressure") this.show(value);
      },
    });
  }

  show(value) {
    const before = this.value.level;
    this.value = value;
    const level = value.level;
    this.root.dataset.level = level;
    if (level === "none") {
      this.root.hidden = true;
      this.root.replaceChildren();
      if (before === "severe") this.ui.announce("Memory pressure has cleared.");
      return;
    }
    this.root.hidden = false;
    const agents = value.agents || [];
    const heading = level === "severe"
      ? "Memory pressure is severe: agents are stalled on memory, and new turns wait until it eases."
      : "Memory pressure is elevated.";
    const items = agents.map((agent) => {
      const thread = this.list.threads.get(agent.thread_id);
      const name = thread ? threadTitle(thread) : agent.thread_id;
      return h(
        "li",
        null,
        h("a", { href: `#/t/${encodeURIComponent(agent.thread_id)}` }, name),
        ` uses about ${bytes(agent.memory_bytes)} `,
        level === "severe"
          ? h("button", { type: "button", class: "small danger", onclick: () => forceStop(this.rpc, this.ui, agent.thread_id), "aria-label": `Force stop ${name}` }, "Force stop")
          : null,
      );
    });
    this.root.replaceChildren(
      h("p", { class: "pressure-heading" }, h("strong", null, heading)),
      agents.length ? h("p", null, "The heaviest agents:") : null,
      agents.length ? h("ul", { class: "pressure-agents" }, ...items) : null,
    );
    // role="alert" on the banner announces a severe level once; elevated stays quiet.
    this.root.setAttribute("role", level === "severe" ? "alert" : "status");
  }
}
