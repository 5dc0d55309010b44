// The pack's templates in the Templates dialog in the README's order.
//
// ComfyUI's /workflow_templates lists a pack's example_workflows in the order its folder
// happens to have on disk (glob, unsorted), and the dialog shows them in that order: the
// README's first template could come last. The page asks the api object for that list;
// this wraps the call and puts this pack's entry in ORDER (names it does not know go
// after, alphabetically). Other packs' lists are left as they are.

import { api } from "../../../scripts/api.js";

// The README's order (tests/shipped_workflows.py TEMPLATES holds the same list).
export const ORDER = [
    "LingBot-World camera preset",
    "LingBot-World camera files",
    "LingBot-World no camera",
    "LingBot-World step cache",
    "LingBot-World long walk",
    "LingBot-World act2cam",
    "LingBot-World Fast clip",
    "LingBot-World Fast walk",
    "LingBot-World Play",
    "LingBot-World Play replay",
];

/** This pack's folder under custom_nodes: the templates list's key (served at /extensions/<folder>/js/). */
function packFolder() {
    const parts = new URL(import.meta.url).pathname.split("/");
    const at = parts.indexOf("extensions");
    return at >= 0 && parts[at + 1] ? decodeURIComponent(parts[at + 1]) : null;
}

function rank(name) {
    const at = ORDER.indexOf(name);
    return at < 0 ? ORDER.length : at;
}

export function inReadmeOrder(names) {
    return [...names].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

const folder = packFolder();
const original = typeof api.getWorkflowTemplates === "function" ? api.getWorkflowTemplates.bind(api) : null;
if (folder && original) {
    api.getWorkflowTemplates = async (...args) => {
        const templates = await original(...args);
        if (templates && Array.isArray(templates[folder])) templates[folder] = inReadmeOrder(templates[folder]);
        return templates;
    };
}
