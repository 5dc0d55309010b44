// Plays the frames of a session on a canvas at the video's frame rate.
// Pure module (no ComfyUI imports).
//
// Chunks arrive as bursts (9 or 12 JPEG frames at once, seconds apart on a consumer
// card); showing them as they come would flash the chunk by in one paint. The player
// queues them and draws one per 1/fps s, so the page shows the motion the video will
// have. When it falls behind (a background tab, a slow decode) and more than the newest
// chunk is waiting, the older frames are dropped: the picture shows the latest chunk
// rather than an ever-growing delay.

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

    /** Queue a chunk: ``frames`` are base64 JPEG strings, the first is video frame ``first``. */
    push(frames, first = 0) {
        if (this._stopped || !frames.length) return;
        frames.forEach((data, i) => {
            const image = new Image();
            image.decoding = "async";
            image.src = `data:image/jpeg;base64,${data}`;
            image.lingbotIndex = first + i;
            this._queue.push(image);
        });
        this._backlog = frames.length;
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
