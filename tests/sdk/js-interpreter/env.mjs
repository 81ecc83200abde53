// Imported first by the interpreter tests: the shared helpers (../js/helpers.mjs) read the
// template for their readiness probe at import time, and this suite needs the code-interpreter
// template (the SDK's default, `code-interpreter-v1`) to be buildable and startable.
process.env.BULKHEAD_TEST_TEMPLATE ??= 'code-interpreter-v1'
