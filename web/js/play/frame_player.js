// Plays the frames of a session on a canvas at the video's frame rate.
// Pure module (no ComfyUI imports).
//
// Chunks arrive as bursts (9 or 12 JPEG frames, seconds apart on a consumer card), each
// in parts as the VAE decodes it (1 or 4 frames per latent frame, a part every ~0.1 s);
// showing them as they come would flash the chunk by in one paint. The player queues
// them in video order and draws one per 1/fps s, so the page shows the motion the video
// will have; a part that arrives while the one before still plays continues on the same
// beat. When it falls behind (a background tab, a slow decode) and more than the newest
// chunk is waiting, the older frames are dropped: the picture shows the latest chunk
// rather than an ever-growing delay. A chunk's own frames are never dropped for its parts.

export class FramePlayer {
    /**
     * @param {HTMLCanvasElement} canvas  drawn on, resized to the frames' size
     * @param {object} options  fps (frames per second, default 16), now() (ms clock),
     *     schedule(callback) (the next paint; requestAnimationFrame by default),
     *     onDraw(player) after each frame drawn
     */
    constructor(canvas, { fps = 16, now = () => performance.now(), schedule = null,
                          onDraw = () => {} } = {}) {
        this.canvas = canvas;
        this.onDraw = onDraw;
        this.fps = fps;
        this._now = now;
        this._schedule = schedule ?? ((cb) => requestAnimationFrame(cb));
        this._queue = [];           // HTMLImageElement, oldest first
        this._backlog = 12;          // at most this many frames wait (the newest chunk's size)
        this._due = 0;              // when the next frame may be drawn (ms)
        this._running = false;
        this._stopped = false;
        this.shown = 0;             // frames drawn so far
        this.dropped = 0;           // frames skipped to catch up
        this.lastFrameIndex = -1;   // video frame index of the frame on screen
    }

    /**
     * Queue a chunk or a part of one: ``frames`` are base64 JPEG strings, the first is video
     * frame ``first``; ``chunkFrames``: the frames of the whole chunk they belong to (what
     * may wait; default: these frames, a chunk sent whole).
     */
    push(frames, first = 0, chunkFrames = frames.length) {
        if (this._stopped || !frames.length) return;
        frames.forEach((data, i) => {
            if (first + i <= this.lastFrameIndex) {  // drawn past already: showing it would jump back
                this.dropped += 1;
                return;
            }
            const image = new Image();
            image.decoding = "async";
            image.src = `data:image/jpeg;base64,${data}`;
            image.lingbotIndex = first + i;
            // In video order, whatever order the parts came in (appended when in order).
            let at = this._queue.length;
            while (at > 0 && this._queue[at - 1].lingbotIndex > image.lingbotIndex) at -= 1;
            this._queue.splice(at, 0, image);
        });
        this._backlog = Math.max(chunkFrames, frames.length);
        if (this._queue.length > this._backlog) {
            const excess = this._queue.length - this._backlog;
            this._queue.splice(0, excess);
            this.dropped += excess;
        }
        this._start();
    }

    get waiting() {
        return this._queue.length;
    }

    /** Forget queued frames (a new session); what is on the canvas stays. */
    reset() {
        this._queue = [];
        this.lastFrameIndex = -1;
    }

    stop() {
        this._stopped = true;
        this._queue = [];
    }

    _start() {
        if (this._running || this._stopped) return;
        this._running = true;
        this._due = Math.max(this._due, this._now());
        this._schedule(() => this._tick());
    }

    _tick() {
        if (this._stopped) {
            this._running = false;
            return;
        }
        const now = this._now();
        const period = 1000 / this.fps;
        if (now >= this._due) {
            const head = this._queue[0];
            if (head && head.complete) {
                this._queue.shift();
                if (head.naturalWidth > 0) this._draw(head);  // a frame that failed to decode is skipped
                // Keep the beat, but never try to make up for time the tab was not painted.
                this._due = now - this._due > 2 * period ? now + period : this._due + period;
            }
        }
        if (this._queue.length) {
            this._schedule(() => this._tick());
        } else {
            this._running = false;
        }
    }

    _draw(image) {
        const { canvas } = this;
        if (canvas.width !== image.naturalWidth || canvas.height !== image.naturalHeight) {
            canvas.width = image.naturalWidth;
            canvas.height = image.naturalHeight;
        }
        canvas.getContext("2d").drawImage(image, 0, 0);
        this.shown += 1;
        this.lastFrameIndex = image.lingbotIndex;
        this.onDraw(this);
    }
}
