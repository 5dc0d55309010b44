// The Play panel's stylesheet, added to the page once. Colours come from ComfyUI's theme
// variables (with fallbacks), so the panel follows the light and dark palettes.

const CSS = `
.lingbot-play {
    box-sizing: border-box; display: flex; flex-direction: column; gap: 4px;
    width: 100%; height: 100%; padding: 4px; outline: none; border-radius: 6px;
    border: 2px solid transparent; font: 12px/1.3 sans-serif;
    color: var(--input-text, #ddd); background: var(--comfy-input-bg, #222);
}
.lingbot-play.lbp-capturing { border-color: var(--p-primary-color, #4a9eff); }
/* Only the picture gives when the panel is short: the other rows keep their height (a row with
   overflow: hidden would otherwise shrink to nothing: the top line clipped), and the file name
   line has its height before there is a file, so the session's end moves nothing. */
.lingbot-play > * { flex: none; }
.lingbot-play .lbp-top, .lingbot-play .lbp-info { display: flex; gap: 8px; align-items: center;
    white-space: nowrap; overflow: hidden; }
.lingbot-play .lbp-info { min-height: 1.3em; }
.lingbot-play .lbp-state { font-weight: bold; text-transform: uppercase; letter-spacing: 0.04em; }
.lingbot-play[data-state="running"] .lbp-state { color: #5c5; }
.lingbot-play[data-state="paused"] .lbp-state, .lingbot-play[data-state="waiting"] .lbp-state { color: #fc4; }
.lingbot-play[data-state="ended"] .lbp-state { color: #aaa; }
.lingbot-play .lbp-role { padding: 0 6px; border-radius: 8px; background: #733; color: #fff; }
.lingbot-play[data-role="controller"] .lbp-role { background: #264; }
.lingbot-play[data-role="none"] .lbp-role { display: none; }
.lingbot-play .lbp-stats { margin-left: auto; opacity: 0.85; min-width: 0; overflow: hidden; text-overflow: ellipsis; }
.lingbot-play .lbp-keyboard { opacity: 0.75; }
.lingbot-play .lbp-keyboard:empty { display: none; }
.lingbot-play.lbp-capturing .lbp-keyboard { opacity: 1; color: var(--p-primary-color, #4a9eff); font-weight: bold; }
/* The picture fills the room the node leaves it and asks for none: the canvas is laid out out of
   flow, so its picture's shape (832x480 before a session, the session's size after) never
   makes the panel, and the node around it, taller. */
.lingbot-play .lbp-screen { position: relative; flex: 1 1 0; min-height: 60px; background: #000;
    border-radius: 4px; overflow: hidden; cursor: pointer; }
.lingbot-play .lbp-screen canvas { position: absolute; inset: 0; width: 100%; height: 100%;
    object-fit: contain; display: block; }
.lingbot-play .lbp-overlay { position: absolute; inset: auto 0 0 0; display: flex; align-items: center;
    justify-content: center; text-align: center; padding: 4px 8px; color: #eee;
    background: rgba(0, 0, 0, 0.6); pointer-events: none; }
.lingbot-play[data-shown="0"] .lbp-overlay { inset: 0; }
.lingbot-play .lbp-overlay:empty { display: none; }
.lingbot-play .lbp-bottom { display: flex; gap: 12px; align-items: center; }
.lingbot-play .lbp-pad { display: grid; grid-template-columns: repeat(3, 22px); gap: 2px; }
.lingbot-play .lbp-cap { grid-row: 2; height: 20px; border-radius: 3px; text-align: center;
    line-height: 20px; font-weight: bold; border: 1px solid var(--border-color, #555); opacity: 0.75; }
.lingbot-play .lbp-cap.lbp-up { grid-row: 1; grid-column: 2; }
.lingbot-play .lbp-cap.lbp-held { background: var(--p-primary-color, #4a9eff); color: #000;
    opacity: 1; border-color: #fff; }
.lingbot-play .lbp-pad-label { grid-row: 3; grid-column: 1 / 4; text-align: center; font-size: 10px;
    opacity: 0.7; }
.lingbot-play .lbp-numbers { display: flex; flex-direction: column; gap: 2px; min-width: 0;
    white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.lingbot-play .lbp-buttons { display: flex; gap: 4px; }
.lingbot-play .lbp-buttons button { flex: 1 1 0; min-width: 0; }
.lingbot-play button { font: inherit; padding: 3px 4px; border-radius: 4px; cursor: pointer;
    color: var(--input-text, #ddd); background: var(--comfy-menu-bg, #333);
    border: 1px solid var(--border-color, #555); }
.lingbot-play button:disabled { opacity: 0.4; cursor: default; }
.lingbot-play button.lbp-primary:not(:disabled) { background: var(--p-primary-color, #4a9eff);
    color: #000; font-weight: bold; }
.lingbot-play .lbp-info a { color: inherit; }
.lingbot-play .lbp-error { color: #f77; overflow: hidden; text-overflow: ellipsis; }
`;

export function addPlayStyle(doc = document) {
    if (doc.getElementById("lingbot-play-style")) return;
    const style = doc.createElement("style");
    style.id = "lingbot-play-style";
    style.textContent = CSS;
    doc.head.appendChild(style);
}
