"""The pack's nodes in the real frontend's node search and node library.

Issue 27: twelve nodes sat in one flat "LingBot-World" category and "lingbot act" found
nothing. The search box (a double-click on the empty canvas, as a person opens it) is typed
into and its result list read. The frontend's search matches every word of the query within
one of a node's name, display name or (hosts with V3 ``search_aliases``, ComfyUI 0.28 and
frontend 1.58) one alias, near its start; on the CI host (0.3.75, frontend 1.32.9) the
display names must carry it.
"""
from __future__ import annotations

import pytest

from comfy_server import ComfyServer
from frontend import ComfyFrontend

# query -> display names that must be among its results
FOUND = {
    "lingbot act": {"LingBot-World Camera (Act, Base-Cam)"},
    "lingbot play": {"LingBot-World Play"},
    "lingbot fast": {"LingBot-World Fast DiT Loader", "LingBot-World Fast Sampler", "LingBot-World Fast Long Video"},
}
CATEGORIES = {
    "LingBotWorldDiTLoader": "LingBot-World/Base", "LingBotWorldSampler": "LingBot-World/Base",
    "LingBotWorldLongVideo": "LingBot-World/Base", "LingBotWorldLoraLoader": "LingBot-World/Base",
    "LingBotWorldFastDiTLoader": "LingBot-World/Fast", "LingBotWorldFastSampler": "LingBot-World/Fast",
    "LingBotWorldFastLongVideo": "LingBot-World/Fast", "LingBotWorldPlay": "LingBot-World/Play",
    "LingBotWorldCamera": "LingBot-World/Camera and Act", "LingBotWorldTextEncode": "LingBot-World/Text and VAE",
    "LingBotWorldVAEEncode": "LingBot-World/Text and VAE", "LingBotWorldVAEDecode": "LingBot-World/Text and VAE",
}
_JS_RESULTS = """() => [...document.querySelectorAll('.comfy-vue-node-search-container li, .p-autocomplete-list li')]
    .map(li => (li.querySelector('.option-display-name') ?? li).innerText.replace(/\\u00a0/g, ' ').trim().split('\\n')[0])
    .filter(Boolean)"""


def search(frontend: ComfyFrontend, query: str) -> list[str]:
    page = frontend.page
    field = page.locator(".comfy-vue-node-search-container input, .p-autocomplete-input").first
    for attempt in range(3):  # on a loaded box the page may take the first double-click before it listens
        page.keyboard.press("Escape")
        box = page.locator("#graph-canvas").bounding_box()
        page.mouse.dblclick(box["x"] + 300, box["y"] + box["height"] / 2)  # clear of the nodes and the minimap
        try:
            field.wait_for(timeout=10_000)
            break
        except Exception:  # Playwright's TimeoutError: the search box did not open; try again
            if attempt == 2:
                raise
    field.fill(query)
    results: list[str] = []
    for _ in range(20):  # the results follow the typing after a debounce (longer under load)
        page.wait_for_timeout(300)
        results = [name.strip() for name in page.evaluate(_JS_RESULTS)]
        if results:
            break
    return results


def test_pack_nodes_sit_in_one_folder_per_kind(comfy_server: ComfyServer) -> None:
    info = comfy_server.object_info()
    assert {node: info[node]["category"] for node in CATEGORIES} == CATEGORIES


@pytest.mark.parametrize("query", sorted(FOUND))
def test_the_node_search_finds_the_nodes_of(frontend: ComfyFrontend, query: str) -> None:
    results = search(frontend, query)
    missing = FOUND[query] - set(results)
    assert not missing, f"{query!r} did not find {sorted(missing)}; the search showed {results}"
