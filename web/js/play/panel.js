// The Play panel: live frames, the keys held, the chunk latency, the session's state and
// its buttons. Pure DOM (no ComfyUI imports): lingbot_play.js puts it on the node and
// wires it to the server; the browser tests drive it on its own too.
//
// Keyboard: while the panel has focus (a click on it, or its Play button), W A S D and
// I J K L are held/released with preventDefault + stopPropagation, and no other plain key
// leaves the panel either, so the page's single-key shortcuts (W opens the workflows
// sidebar, R reloads node definitions, ...) do not fire while playing. Escape, a click
// elsewhere, or the window losing focus releases every key (the server is sent "").
// A button that disables itself (Continue, Pause, Step) hands the focus to the panel first,
// so the keyboard never falls to the page mid-session; when the session ends the panel lets
// the focus go and says so ("keys: ComfyUI"). A view-only tab's focused panel swallows the
// play keys too (they are the controlling tab's), so they open no sidebar here either.
//
// Between Run and the session's first frame the node loads the model, encodes the image and
// warms up (minutes on a CPU): the panel says which ("starting: loading the model"), and
// goes back to idle with the node's error when it fails before the session began.
//
// State for tests and styles sits on the root element: data-state, data-role, data-held,
// data-chunks, data-frames, data-shown (frames drawn), data-last (the video frame on screen).

import { FramePlayer } from "./frame_player.js";
import { HeldKeys, LOOK_KEYS, MOVE_KEYS, playKeyOf } from "./keys.js";
import { addPlayStyle } from "./style.js";

const HINT_IDLE = "Run the workflow to start a session";
const HINT_STARTING = "Starting the session: ";  // + the step the node is at (loading the model, ...)
const HINT_FOCUS = "Click here (or Play), then hold W A S D to move and I J K L to look";
const HINT_VIEWER = "view-only: this session is controlled by another tab";
const HINT_VIEWER_KEYS = "view-only: the keys steer the session in the tab that runs it";
// The top line's keyboard label: where the keys go now.
const KEYS_SESSION = "keys: session";
const KEYS_PAGE = "keys: ComfyUI";
const BUTTONS = [
    ["play", "Play", "Give the keyboard to the session (Esc gives it back)"],
    ["pause", "Pause", "Stop after the current chunk"],
    ["step", "Step", "Run one chunk with the keys held now"],
    ["continue", "Continue", "Run chunks back to back"],
    ["stop", "Stop", "End the session; the video and action log are kept"],
];
const LIVE = new Set(["waiting", "running", "paused"]);

export class PlayPanel {
    /**
     * @param {object} handlers  onKeys(keys) when the held set changes (controller only),
     *     onControl(action) for the buttons ("step" | "pause" | "continue" | "stop")
     */
    constructor({ onKeys = () => {}, onControl = () => {}, doc = document } = {}) {
        addPlayStyle(doc);
        this.onKeys = onKeys;
        this.onControl = onControl;
        this.held = new HeldKeys();
        this.session = null;   // {sessionId, controller, mode, fps, ...}
        this.state = "idle";
        this.startingStep = null;  // what the node is doing while the state is "starting"
        this.role = "none";
        this.capturing = false;
        this._listeners = [];
        this._build(doc);
        this.player = new FramePlayer(this.canvas, { onDraw: () => this.tick() });
        this._render();
    }

    // ----- building -------------------------------------------------------------------

    _build(doc) {
        const el = (tag, cls, text) => {
            const e = doc.createElement(tag);
            if (cls) e.className = cls;
            if (text) e.textContent = text;
            return e;
        };
        const root = (this.element = el("div", "lingbot-play"));
        root.tabIndex = 0;

        const top = el("div", "lbp-top");
        this.stateLabel = el("span", "lbp-state");
        this.roleLabel = el("span", "lbp-role");
        this.statsLabel = el("span", "lbp-stats");
        this.keyboardLabel = el("span", "lbp-keyboard");
        top.append(this.stateLabel, this.roleLabel, this.keyboardLabel, this.statsLabel);

        const screen = (this.screen = el("div", "lbp-screen"));
        this.canvas = el("canvas");
        this.canvas.width = 832;
        this.canvas.height = 480;
        this.overlay = el("div", "lbp-overlay");
        screen.append(this.canvas, this.overlay);

        const bottom = el("div", "lbp-bottom");
        this.caps = {};
        const pad = (keys, label) => {
            const box = el("div", "lbp-pad");
            [...keys].forEach((k, i) => {
                const cap = el("div", i === 0 ? "lbp-cap lbp-up" : "lbp-cap", k.toUpperCase());
                cap.dataset.key = k;
                if (i > 0) cap.style.gridColumn = String(i);  // W over A S D, I over J K L
                this.caps[k] = cap;
                box.append(cap);
            });
            box.append(el("div", "lbp-pad-label", label));
            return box;
        };
        this.latencyLabel = el("span", "lbp-latency");
        this.chunkLabel = el("span", "lbp-chunk-time");
        this.modeLabel = el("span", "lbp-mode");
        const numbers = el("div", "lbp-numbers");
        numbers.append(this.latencyLabel, this.chunkLabel, this.modeLabel);
        bottom.append(pad(MOVE_KEYS, "move"), pad(LOOK_KEYS, "look"), numbers);

        const buttons = el("div", "lbp-buttons");
        this.buttons = {};
        for (const [action, text, title] of BUTTONS) {
            const button = el("button", `lbp-${action}`, text);
            button.type = "button";
            button.title = title;
            button.dataset.action = action;
            button.addEventListener("click", () => this._clicked(action));
            this.buttons[action] = button;
            buttons.append(button);
        }

        const info = el("div", "lbp-info");
        this.videoLink = el("a", "lbp-video");
        this.videoLink.target = "_blank";
        this.errorLabel = el("span", "lbp-error");
        info.append(this.videoLink, this.errorLabel);

        root.append(top, screen, bottom, buttons, info);

        this._on(root, "keydown", (e) => this._key(e, true));
        this._on(root, "keyup", (e) => this._key(e, false));
        this._on(root, "focusin", () => this._setCapturing(this._canPlay()));
        this._on(root, "focusout", (e) => {
            if (!root.contains(e.relatedTarget)) this._setCapturing(false);
        });
        // The frontend blurs a DOM widget on a click elsewhere, but focus may sit on one of
        // the buttons inside; a press outside the panel always ends the capture.
        this._on(doc, "pointerdown", (e) => {
            if (this.capturing && !root.contains(e.target)) this._release(true);
        }, true);
        // Keys released while the window is away never send keyup; back with the panel
        // still focused, it takes the keys again.
        const view = doc.defaultView ?? window;
        this._on(view, "blur", () => this._setCapturing(false));
        this._on(view, "focus", () => {
            if (root.contains(doc.activeElement)) this._setCapturing(this._canPlay());
        });
    }

    _on(target, type, handler, capture = false) {
        target.addEventListener(type, handler, capture);
        this._listeners.push([target, type, handler, capture]);
    }

    // ----- what the server says -------------------------------------------------------

    /** A session started (or was found running): ``controller`` is true for this tab. */
    startSession({ sessionId, controller, mode = "turn", fps = 16, width, height,
                   chunkBudget = null, idleTimeout = null }) {
        const fresh = this.session?.sessionId !== sessionId;
        this.session = { sessionId, controller, mode, fps, chunkBudget, idleTimeout };
        this.role = controller ? "controller" : "viewer";
        if (fresh) {
            this.chunks = 0;
            this.framesDone = 0;
            this.latency = null;
            this.chunkSeconds = null;
            this.steered = "";
            this.viewerKeyed = false;
            this.player.reset();
            this.videoLink.removeAttribute("href");
            this.videoLink.textContent = "";
            this.errorLabel.textContent = "";
            if (width && height) {
                this.canvas.width = width;
                this.canvas.height = height;
            }
        }
        this.player.fps = fps;
        if (this.state === "idle" || this.state === "starting" || fresh) this.state = "waiting";
        if (!controller) this._release(true);
        else if (this.capturing && this.held.value) this.onKeys(this.held.value);
        this._render();
    }

    /**
     * A ``lingbot.play.starting`` event for this panel's node: ``step`` is what it is doing
     * before the session takes keys; null when it failed before the session began (``error``).
     */
    showStarting(step, error = null) {
        if (step) {
            if (LIVE.has(this.state)) return;  // a session is already on: not a start of this node's
            this.state = "starting";
            this.startingStep = step;
            this.showError("");
        } else if (this.state === "starting") {
            this.state = "idle";
            this.startingStep = null;
            this.showError(error ? `the session did not start: ${error}` : "the session did not start");
        }
        this._render();
    }

    /** A ``lingbot.play.frames`` event of this panel's session. */
    showFrames({ chunk, first_frame: first = 0, frames = [], chunk_frames: chunkFrames = frames.length, keys = "",
                 latency_s: latency = null, chunk_s: chunkSeconds = null }) {
        this.player.push(frames, first, chunkFrames);  // a part of a chunk, or a whole one
        this.chunks = Math.max(this.chunks ?? 0, chunk + 1);
        this.framesDone = Math.max(this.framesDone ?? 0, first + frames.length);
        if (latency !== null && latency !== undefined) this.latency = latency;
        if (chunkSeconds !== null && chunkSeconds !== undefined) this.chunkSeconds = chunkSeconds;
        this.steered = keys;
        this._render();
    }

    /** A ``lingbot.play.state`` event of this panel's session. */
    showState({ state, chunks_done: chunks, frames_done: frames, reason = null, video = null },
              videoUrl = null) {
        // "ended" is final for a session: a later state is stale (the reply to Stop, sent
        // before the session closed, may arrive after the "ended" event).
        if (this.state === "ended" && state !== "ended" && this.session) return;
        this.state = state;
        // Counts only grow within a session: a state event sent before a chunk's frames were
        // decoded must not take a page back behind the frames it has shown.
        if (chunks !== undefined) this.chunks = Math.max(this.chunks ?? 0, chunks);
        if (frames !== undefined) this.framesDone = Math.max(this.framesDone ?? 0, frames);
        this.reason = reason;
        if (state === "ended") {
            this._release(false);  // the session is gone: nothing to tell it
            this.steered = "";  // a viewer's lit keys were the session's
            this._letFocusGo();
            if (video && videoUrl) {
                this.videoLink.href = videoUrl;
                this.videoLink.textContent = `video: ${video.filename}`;
            }
        }
        this._render();
    }

    showMode(mode) {
        if (this.session && mode) this.session.mode = mode;
        this._render();
    }

    showError(message) {
        this.errorLabel.textContent = message ?? "";
        this.errorLabel.title = message ?? "";
    }

    /** Give the keyboard to the session (the Play button, or tests). */
    focus() {
        this.element.focus({ preventScroll: true });
    }

    dispose() {
        this._release(true);
        this.player.stop();
        for (const [target, type, handler, capture] of this._listeners) {
            target.removeEventListener(type, handler, capture);
        }
        this._listeners = [];
    }

    // ----- what the person does -------------------------------------------------------

    _canPlay() {
        return this.role === "controller" && LIVE.has(this.state);
    }

    _key(event, down) {
        if (!this.capturing) {
            // A view-only tab: the play keys are the controlling tab's, never this page's shortcuts.
            if (this.role === "viewer" && LIVE.has(this.state) && playKeyOf(event)) {
                event.preventDefault();
                event.stopPropagation();
                if (down && !this.viewerKeyed) {
                    this.viewerKeyed = true;
                    this._render();
                }
            }
            return;
        }
        if (event.key === "Escape" && down) {
            event.preventDefault();
            event.stopPropagation();
            this._release(true);
            if (this.element.contains(this.element.ownerDocument.activeElement)) {
                this.element.ownerDocument.activeElement.blur();
            }
            return;
        }
        const key = playKeyOf(event);
        if (key) {
            event.preventDefault();
            event.stopPropagation();
            if (down && event.repeat) return;  // the OS repeating a held key changes nothing
            const changed = down ? this.held.press(key) : this.held.release(key);
            if (changed) {
                this.onKeys(this.held.value);
                this._render();
            }
            return;
        }
        // Any other plain key stays in the panel (no single-key shortcut fires while
        // playing); its default still happens (Space or Enter on a focused button).
        if (!(event.ctrlKey || event.altKey || event.metaKey) && event.key !== "Tab") {
            event.stopPropagation();
        }
    }

    _clicked(action) {
        // The panel itself holds the focus from here: the button may disable itself (Continue,
        // Pause, Step), and a disabled button drops the focus to the page.
        if (this.role === "controller" && LIVE.has(this.state)) this.focus();
        if (action === "play") return;
        if (action === "continue") this.showMode("continuous");
        this.onControl(action);
    }

    _setCapturing(on) {
        if (on) {
            this.capturing = true;
            this._render();
        } else {
            this._release(true);
        }
    }

    /** The session is over: a focus inside the panel goes back to the page (the label says so). */
    _letFocusGo() {
        const active = this.element.ownerDocument.activeElement;
        if (active && this.element.contains(active)) active.blur();
    }

    /** Release every key; ``tell`` the server ("") when some were held. */
    _release(tell) {
        const had = this.held.clear();
        const was = this.capturing;
        this.capturing = false;
        if (had && tell && this.role === "controller" && LIVE.has(this.state)) this.onKeys("");
        if (had || was) this._render();
    }

    // ----- drawing --------------------------------------------------------------------

    _render() {
        const root = this.element;
        const live = LIVE.has(this.state);
        const controller = this.role === "controller";
        root.dataset.state = this.state;
        root.dataset.role = this.role;
        root.dataset.held = this.held.value;
        root.dataset.chunks = String(this.chunks ?? 0);
        root.dataset.frames = String(this.framesDone ?? 0);
        root.dataset.shown = String(this.player.shown);
        root.dataset.last = String(this.player.lastFrameIndex);
        root.classList.toggle("lbp-capturing", this.capturing);

        let label = this.state;
        if (this.state === "ended" && this.reason) label = `ended: ${this.reason}`;
        if (this.state === "starting" && this.startingStep) label = `starting: ${this.startingStep}`;
        this.stateLabel.textContent = label;
        this.roleLabel.textContent = controller ? "controller" : this.role === "viewer" ? "view-only" : "";
        this.statsLabel.textContent = this.session
            ? `chunk ${this.chunks ?? 0} · ${this.framesDone ?? 0} frames`
                + (this.session.chunkBudget ? ` / ${this.session.chunkBudget} chunks` : "")
            : "";

        const lit = controller ? this.held.value : this.steered ?? "";
        for (const [k, cap] of Object.entries(this.caps)) cap.classList.toggle("lbp-held", lit.includes(k));

        const seconds = (value) => (value === null || value === undefined ? "–" : `${value.toFixed(2)} s`);
        this.latencyLabel.textContent = `key → frame ${seconds(this.latency)}`;
        this.chunkLabel.textContent = `chunk time ${seconds(this.chunkSeconds)}`;
        this.modeLabel.textContent = this.session
            ? `${this.session.mode === "turn" ? "turn-based" : "continuous"} · ${this.session.fps} fps`
            : "";

        this.keyboardLabel.textContent = this.capturing ? KEYS_SESSION : this.session ? KEYS_PAGE : "";
        root.dataset.keyboard = this.capturing ? "session" : "page";

        const can = controller && live;
        const disabled = {
            play: !can,
            pause: !(can && this.state === "running"),
            step: !(can && this.state !== "running"),
            continue: !(can && this.state !== "running"),
            stop: !can,
        };
        // A focused button about to be disabled hands the focus to the panel first (else the
        // browser drops it to the page, whose shortcuts would then take the play keys).
        const active = root.ownerDocument.activeElement;
        const losing = Object.entries(this.buttons).some(([action, b]) => b === active && disabled[action]);
        if (losing && can) root.focus({ preventScroll: true });
        for (const [action, button] of Object.entries(this.buttons)) button.disabled = disabled[action];
        const turn = this.session?.mode === "turn";
        this.buttons.step.classList.toggle("lbp-primary", turn || this.state === "paused");
        this.buttons.continue.classList.toggle("lbp-primary", !turn && this.state !== "running");

        let hint = "";
        if (this.state === "starting") hint = `${HINT_STARTING}${this.startingStep ?? ""}…`;
        else if (!this.session || this.state === "idle") hint = HINT_IDLE;
        else if (this.role === "viewer" && live) hint = this.viewerKeyed ? HINT_VIEWER_KEYS : this.player.shown ? "" : HINT_VIEWER;
        else if (live && !this.capturing) hint = HINT_FOCUS;
        this.overlay.textContent = hint;
    }

    /** Refresh what depends on the player (frames shown); cheap, called per drawn frame. */
    tick() {
        this.element.dataset.shown = String(this.player.shown);
        this.element.dataset.last = String(this.player.lastFrameIndex);
        if (this.role === "viewer" && this.player.shown && this.overlay.textContent) this._render();
    }
}
