// The page's side of the Play routes (docs: play_protocol). Pure module: the entry point
// passes ComfyUI's api.fetchApi (which adds the /api prefix and the page's credentials)
// and a getter of this tab's client_id.

export class PlayClient {
    constructor(fetchApi, clientId) {
        this._fetch = fetchApi;
        this._clientId = clientId;
    }

    /** POST the keys held now ("" for none); resolves to {ok, status, message}. */
    keys(sessionId, keys) {
        return this._post(`/lingbot/play/${encodeURIComponent(sessionId)}/keys`,
                          { client_id: this._clientId(), keys });
    }

    /** POST a button: "step" | "pause" | "continue" | "stop"; {ok, status, message, data}. */
    control(sessionId, action) {
        return this._post(`/lingbot/play/${encodeURIComponent(sessionId)}/control`,
                          { client_id: this._clientId(), action });
    }

    /** The ids of running sessions ([] when the route answers anything else). */
    async running() {
        const reply = await this._get("/lingbot/play");
        if (!reply.ok) return [];
        const data = reply.data;
        const ids = Array.isArray(data) ? data : data?.sessions ?? data?.session_ids ?? [];
        return ids.map((s) => (typeof s === "string" ? s : s?.session_id)).filter(Boolean);
    }

    /** One session's state ({state, mode, chunks_done, frames_done, controller, keys}) or null. */
    async describe(sessionId) {
        const reply = await this._get(`/lingbot/play/${encodeURIComponent(sessionId)}`);
        return reply.ok ? reply.data : null;
    }

    async _post(route, body) {
        return this._answer(await this._fetch(route, {
            method: "POST",
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify(body),
        }));
    }

    async _get(route) {
        return this._answer(await this._fetch(route, { cache: "no-store" }));
    }

    async _answer(response) {
        const text = await response.text();
        let data = null;
        try {
            data = text ? JSON.parse(text) : null;
        } catch {
            data = null;
        }
        const message = response.ok ? "" : messageOf(data) ?? (text.trim() || response.statusText);
        return { ok: response.ok, status: response.status, message, data };
    }
}

function messageOf(data) {
    if (!data || typeof data !== "object") return null;
    const value = data.error ?? data.message;
    if (typeof value === "string") return value;
    if (value && typeof value.message === "string") return value.message;
    return null;
}
