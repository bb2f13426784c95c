// One way to open an IndexedDB database through idb (vendored): opened once and
// shared; opened again on next use when another tab upgrades the schema (this tab
// lets it) or the browser closes the database (cleared by the user, say); null
// where IndexedDB is unavailable, and then what it would hold does not survive a
// reload. history.js (the metric history) and conversations.js (chat) use it.

import { openDB } from "./vendor/idb/index.js";

/** A function giving the database (a promise of it, or of null), opened on first use. */
export function reopeningDatabase(name, version, upgrade, what) {
  let opening = null;
  async function connect() {
    try {
      const db = await openDB(name, version, {
        upgrade,
        blocked() {
          console.warn(`IndexedDB upgrade of ${name} is blocked by another tab`);
        },
        blocking() {
          db.close();
          opening = null;
        },
        terminated() {
          opening = null;
        },
      });
      return db;
    } catch (error) {
      console.warn(`IndexedDB is unavailable; ${what} will not survive a reload`, error);
      return null;
    }
  }
  return () => {
    if (!opening) opening = connect();
    return opening;
  };
}
