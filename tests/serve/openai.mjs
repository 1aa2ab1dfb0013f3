// openai.mjs: loads the `openai` npm client that scripts/setup.sh installs
// into .dev/node (SPECTRA_NODE_DIR), for the scripts of tests/serve.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';

export async function loadOpenAI() {
  const dir = resolve(process.env.SPECTRA_NODE_DIR || '.dev/node');
  const req = createRequire(resolve(dir, 'package.json'));
  let path;
  try {
    path = req.resolve('openai');
  } catch (e) {
    console.error(`the openai npm package is not installed in ${dir}: run make setup`);
    process.exit(3);
  }
  const mod = await import(pathToFileURL(path).href);
  return mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;
}
