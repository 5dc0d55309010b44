// The keys a Play session listens to, and the set of those held right now.
// Pure module (no ComfyUI imports): the panel and the browser tests use it as is.

/** W A S D move, I J K L look; the order the page writes them in (docs/play_protocol). */
export const PLAY_KEYS = "wasdijkl";
export const MOVE_KEYS = "wasd";
export const LOOK_KEYS = "ijkl";

/**
 * The play key a keyboard event means, or null.
 * By physical position (event.code "KeyW"), so that W A S D sit under the same fingers on
 * any layout; event.key is the fallback for events that carry no code.
 * Events with Ctrl, Alt or Meta are shortcuts, never play keys.
 */
export function playKeyOf(event) {
    if (event.ctrlKey || event.altKey || event.metaKey) return null;
    const code = typeof event.code === "string" ? event.code : "";
    if (code.startsWith("Key") && code.length === 4) {
        const letter = code[3].toLowerCase();
        return PLAY_KEYS.includes(letter) ? letter : null;
    }
    const key = typeof event.key === "string" ? event.key.toLowerCase() : "";
    return key.length === 1 && PLAY_KEYS.includes(key) ? key : null;
}

/** The keys held, as the protocol's string (a subset of "wasdijkl" in that order). */
export class HeldKeys {
    constructor() {
        this._held = new Set();
    }

    /** Mark ``key`` held; true when that changed the set. */
    press(key) {
        if (!PLAY_KEYS.includes(key) || this._held.has(key)) return false;
        this._held.add(key);
        return true;
    }

    /** Mark ``key`` released; true when that changed the set. */
    release(key) {
        return this._held.delete(key);
    }

    /** Release everything; true when something was held. */
    clear() {
        const had = this._held.size > 0;
        this._held.clear();
        return had;
    }

    has(key) {
        return this._held.has(key);
    }

    get value() {
        return [...PLAY_KEYS].filter((k) => this._held.has(k)).join("");
    }
}

/**
 * Sends key states to the server one at a time, in the order they happened.
 * Every state is sent (in turn-based mode each press starts a chunk, so none may be merged
 * away); only when the server falls far behind are the waiting states collapsed to the
 * newest one. ``post(keys)`` returns a promise of {ok, status, message}.
 */
export class KeySender {
    constructor(post, { onResult = () => {}, maxWaiting = 32 } = {}) {
        this._post = post;
        this._onResult = onResult;
        this._maxWaiting = maxWaiting;
        this._waiting = [];
        this._busy = false;
        this.sent = [];  // every state posted, in order (the panel shows the last)
    }

    send(keys) {
        this._waiting.push(keys);
        if (this._waiting.length > this._maxWaiting) this._waiting = [this._waiting.at(-1)];
        if (!this._busy) this._drain();
    }

    /** A promise that resolves once nothing is waiting or in flight (tests use it). */
    idle() {
        return new Promise((resolve) => {
            const check = () => (this._busy || this._waiting.length ? setTimeout(check, 10) : resolve());
            check();
        });
    }

    async _drain() {
        this._busy = true;
        try {
            while (this._waiting.length) {
                const keys = this._waiting.shift();
                let result;
                try {
                    result = await this._post(keys);
                } catch (error) {
                    result = { ok: false, status: 0, message: `network: ${error?.message ?? error}` };
                }
                this.sent.push(keys);
                this._onResult(keys, result);
            }
        } finally {
            this._busy = false;
        }
    }
}
