// "Play the world": the panel on LingBot-World Play nodes (docs/play_protocol).
//
// The node runs a session as one queued prompt; its frames come over ComfyUI's websocket
// as lingbot.play.* events, and the keys held go back to the pack's /lingbot/play routes.
// The panel is a DOM widget (node.addDOMWidget, in every frontend from 1.16 on); its
// pieces live in ./play/ and import nothing of ComfyUI.

import { app } from "../../../scripts/app.js";
import { api } from "../../../scripts/api.js";
import { KeySender } from "./play/keys.js";
import { PlayPanel } from "./play/panel.js";
import { PlayClient } from "./play/session_client.js";

const NODE_TYPE = "LingBotWorldPlay";
const MIN_HEIGHT = 300;  // the picture, the key pads and the buttons stay readable

const attached = new Set();          // {node, panel, sender}
const sessions = new Map();          // session_id -> {nodeId, info}
const client = new PlayClient((route, options) => api.fetchApi(route, options), clientId);

function clientId() {
    return api.clientId ?? api.initialClientId ?? sessionStorage.getItem("clientId") ?? "";
}

/** The panel showing ``nodeId``'s session: the Play node with that id, else the only one. */
function entryFor(nodeId) {
    const live = [...attached].filter((e) => e.node.graph);
    const exact = live.find((e) => String(e.node.id) === String(nodeId));
    if (exact) return exact;
    return live.length === 1 ? live[0] : null;
}

function startOn(entry, sessionId, info) {
    entry.sessionId = sessionId;
    entry.panel.startSession({
        sessionId,
        // No controller: the prompt was queued without a client id, and any tab may steer.
        controller: info.controller == null || info.controller === clientId(),
        mode: info.mode ?? "turn",
        fps: info.fps ?? 16,
        width: info.width,
        height: info.height,
        chunkBudget: info.chunk_budget ?? null,
        idleTimeout: info.idle_timeout_s ?? null,
    });
}

/** The entry for an event; a session this page has not seen start yet is looked up first. */
async function entryForEvent(detail) {
    const entry = entryFor(detail.node_id);
    if (!entry) return null;
    if (entry.sessionId !== detail.session_id) {
        let known = sessions.get(detail.session_id);
        if (!known) {
            const info = await client.describe(detail.session_id);
            if (!info) return null;
            known = { nodeId: detail.node_id, info };
            sessions.set(detail.session_id, known);
        }
        startOn(entry, detail.session_id, known.info);
    }
    return entry;
}

function viewUrl(video) {
    const params = new URLSearchParams({
        filename: video.filename, subfolder: video.subfolder ?? "", type: video.type ?? "output",
    });
    return api.apiURL(`/view?${params}`);
}

/** The node is loading, encoding or warming up (or failed to: step null), before its session exists. */
function onStarting({ detail }) {
    entryFor(detail.node_id)?.panel.showStarting(detail.step ?? null, detail.error ?? null);
}

function onStarted({ detail }) {
    sessions.set(detail.session_id, { nodeId: detail.node_id, info: detail });
    const entry = entryFor(detail.node_id);
    if (entry) startOn(entry, detail.session_id, detail);
}

async function onFrames({ detail }) {
    const entry = await entryForEvent(detail);
    entry?.panel.showFrames(detail);
}

async function onState({ detail }) {
    const entry = await entryForEvent(detail);
    if (!entry) return;
    entry.panel.showState(detail, detail.video ? viewUrl(detail.video) : null);
    if (detail.state === "ended") sessions.delete(detail.session_id);
}

/** A page opened (or reloaded) while a session runs: show it, as controller or viewer. */
async function adoptRunningSessions() {
    for (const sessionId of await client.running()) {
        const info = await client.describe(sessionId);
        if (!info) continue;
        sessions.set(sessionId, { nodeId: info.node_id, info });
        const entry = entryFor(info.node_id);
        if (!entry) continue;
        startOn(entry, sessionId, info);
        entry.panel.showState({ state: info.state, chunks_done: info.chunks_done,
                                frames_done: info.frames_done });
    }
}

function attach(node) {
    const entry = { node, sessionId: null };
    const report = (result) => entry.panel.showError(result.ok ? "" : `${result.status}: ${result.message}`);
    entry.sender = new KeySender((keys) => client.keys(entry.sessionId, keys), {
        onResult: (_keys, result) => report(result),
    });
    entry.panel = new PlayPanel({
        onKeys: (keys) => entry.sessionId && entry.sender.send(keys),
        onControl: async (action) => {
            const sessionId = entry.sessionId;
            if (!sessionId) return;
            const result = await client.control(sessionId, action);
            if (entry.sessionId !== sessionId) return;  // a reply about a session no longer shown
            report(result);
            if (result.ok && result.data?.state) entry.panel.showState({ state: result.data.state });
            if (result.ok && result.data?.mode) entry.panel.showMode(result.data.mode);
        },
    });
    // Nodes 2.0 (the frontend's DOM nodes) sizes a widget by its content unless it is marked
    // to take the node's remaining height, as its own text areas and 3-D viewers are.
    entry.panel.element.classList.add("widget-expands");
    const widget = node.addDOMWidget("play", "lingbot_play", entry.panel.element, {
        serialize: false,
        getMinHeight: () => MIN_HEIGHT,
    });
    widget.serialize = false;  // neither in the saved workflow nor in the prompt
    // The session's video is the panel's (its link). The frontend's own player for a node's
    // video output would sit under the panel and grow the node past it (past the window):
    // this node draws no output preview of its own. On the classic canvas the player comes
    // from the class's onDrawBackground; with Nodes 2.0 the node shows what the page's node
    // output store holds for it, which is the very object handed to onExecuted. So the
    // page's copy of the output loses its media (the video stays in /history: the queue, the
    // assets) before anything draws it. Newer frontends (1.58.1, with ComfyUI 0.28) fill the
    // store before onExecuted and draw from it at once (a player under the panel, the node
    // grown): they skip the media of a node whose hideOutputImages is set, as their own
    // Image Crop and Painter nodes do.
    node.hideOutputImages = true;
    node.onDrawBackground = function () {};
    const executed = node.onExecuted;
    node.onExecuted = function (output) {
        if (output && typeof output === "object") {
            delete output.images;
            delete output.animated;
        }
        return executed?.apply(this, arguments);
    };
    node.lingbotPlay = entry.panel;  // for people poking at it from the console, and tests
    attached.add(entry);

    const removed = node.onRemoved;
    node.onRemoved = function () {
        attached.delete(entry);
        entry.panel.dispose();
        return removed?.apply(this, arguments);
    };
    // A graph loaded while a session runs: the node's id is known once it is configured.
    queueMicrotask(() => {
        for (const [sessionId, known] of sessions) {
            if (entryFor(known.nodeId) === entry) startOn(entry, sessionId, known.info);
        }
    });
}

app.registerExtension({
    name: "LingBotWorld.Play",
    async setup() {
        api.addEventListener("lingbot.play.starting", onStarting);
        api.addEventListener("lingbot.play.started", onStarted);
        api.addEventListener("lingbot.play.frames", onFrames);
        api.addEventListener("lingbot.play.state", onState);
        adoptRunningSessions().catch((error) => console.warn("LingBot-World Play:", error));
    },
    nodeCreated(node) {
        if (node.comfyClass === NODE_TYPE) attach(node);
    },
});
