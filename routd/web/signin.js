// The sign-in link carries its token after '#', which browsers never send to a server or
// put in a Referer. The token is exchanged once for an HttpOnly session cookie, then wiped
// from the address bar and history. A link opened over this page (only its fragment
// changes, so the page does not load again) is taken on `hashchange`.
"use strict";

async function signIn() {
  const status = document.getElementById("signin-status");
  const token = decodeURIComponent(location.hash.replace(/^#/, ""));
  history.replaceState(null, "", location.pathname);
  if (!token) {
    const r = await fetch("/web/session", { credentials: "same-origin", cache: "no-store" });
    if (r.ok) {
      location.replace("/web/");
      return;
    }
    status.textContent = "Not signed in. Open the link `hako web` prints.";
    return;
  }
  await post(token, false);
}

// Posts the link's token; `replace`: the person chose to leave the browser's live session.
async function post(token, replace) {
  const status = document.getElementById("signin-status");
  const choice = document.getElementById("signin-replace");
  choice.hidden = true;
  status.textContent = "Signing in…";
  status.className = "";
  try {
    const r = await fetch("/web/session", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ token, replace }),
    });
    if (r.ok) {
      location.replace("/web/");
      return;
    }
    const e = await r.json().catch(() => ({}));
    if (e.error === "already_signed_in") {
      // A link someone sent must not swap this browser's session by itself: say who is
      // signed in and who the link is, and let the person choose.
      status.textContent = e.message;
      choice.hidden = false;
      choice.onclick = () => post(token, true);
      return;
    }
    status.textContent = "Sign-in refused: " + (e.message || r.status);
    status.className = "error";
  } catch (err) {
    status.textContent = "routd does not answer: " + err;
    status.className = "error";
  }
}

window.addEventListener("hashchange", signIn);
signIn();
