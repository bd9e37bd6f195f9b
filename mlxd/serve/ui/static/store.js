// Conversations in IndexedDB, one record per conversation. Every failure is thrown to the caller,
// which shows it: nothing here ever clears or recreates the database.

const DB_NAME = "mlxd-chat";
const DB_VERSION = 1; // a new version adds stores or indexes; it never drops existing records
const STORE = "conversations";
export const EXPORT_FORMAT = "mlxd-chat";

let dbPromise = null;

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error || new Error("IndexedDB request failed"));
  });
}

function open() {
  if (dbPromise) return dbPromise;
  dbPromise = new Promise((resolve, reject) => {
    let req;
    try {
      req = indexedDB.open(DB_NAME, DB_VERSION);
    } catch (e) {
      reject(e);
      return;
    }
    req.onupgradeneeded = () => {
      const db = req.result;
      if (!db.objectStoreNames.contains(STORE)) db.createObjectStore(STORE, { keyPath: "id" });
    };
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error || new Error("cannot open IndexedDB"));
    req.onblocked = () => reject(new Error("IndexedDB is blocked by another tab"));
  });
  dbPromise.catch(() => {
    dbPromise = null; // let a later call try again
  });
  return dbPromise;
}

async function tx(mode, fn) {
  const db = await open();
  return new Promise((resolve, reject) => {
    const t = db.transaction(STORE, mode);
    let result;
    t.oncomplete = () => resolve(result);
    t.onerror = () => reject(t.error || new Error("IndexedDB transaction failed"));
    t.onabort = () => reject(t.error || new Error("IndexedDB transaction aborted (quota?)"));
    request(fn(t.objectStore(STORE))).then((r) => {
      result = r;
    }, reject);
  });
}

export async function listConversations() {
  const all = await tx("readonly", (s) => s.getAll());
  return all.sort((a, b) => b.updated - a.updated);
}

export function saveConversation(conv) {
  // a plain copy: structured clone of the live object, without UI-only fields
  const { streaming, ...record } = conv;
  return tx("readwrite", (s) => s.put(JSON.parse(JSON.stringify(record))));
}

export function deleteConversation(id) {
  return tx("readwrite", (s) => s.delete(id));
}

export function exportJSON(conversations) {
  return JSON.stringify({ format: EXPORT_FORMAT, version: 1, conversations }, null, 2);
}

// Parses an export; throws on anything that is not one (the store is untouched then).
export function parseImport(text) {
  const data = JSON.parse(text);
  const list = Array.isArray(data) ? data : data && data.conversations;
  if (!Array.isArray(list)) throw new Error("not an mlxd chat export (no conversations list)");
  for (const c of list) {
    if (!c || typeof c.id !== "string" || !Array.isArray(c.turns)) {
      throw new Error("not an mlxd chat export (a conversation lacks id or turns)");
    }
  }
  return list;
}
