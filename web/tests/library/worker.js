// The suite in a module Web Worker: same module, same cases, no DOM.
import { runSuite } from "./suite.js";

self.onmessage = async (e) => {
  self.postMessage(await runSuite({ worker: true, backend: e.data.backend }));
};
