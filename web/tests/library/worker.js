// The suite in a module Web Worker: same module, same cases, no DOM.
import { runSuite } from "./suite.js";

self.onmessage = async (e) => {
  const { backend, simd, isa } = e.data;
  self.postMessage(await runSuite({ worker: true, backend, simd, isa }));
};
