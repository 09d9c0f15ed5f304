// Run a script on the real MicroPython (WebAssembly port) under node, with a host
// module `hostio` that bridges it to a real UDP socket and/or a pseudo-terminal.
//
// usage: node [--expose-gc] run.mjs [--lib DIR]... [--data FILE]... [--heap BYTES]
//                     [--udp HOST:PORT] [--drop-in TYPE:COUNT]... [--pty-fd FD]
//                     [--config JSON] script.py
//
// hostio (all strings, bytes as hex):
//   udp_send(hex, host, port)  send a datagram; 255.255.255.255 stands for the
//                              gateway's host (a LAN broadcast reaching it)
//   udp_take()                 "hex host port" of the next datagram received, or ""
//   pty_write(hex) / pty_take()  bytes to / from the pty master
//   ctl_take()                 the next line the test wrote on stdin, or ""
//   config()                   the --config JSON
// --drop-in TYPE:COUNT drops the first COUNT datagrams of MsgType TYPE (hex) that
// arrive from the gateway: a lossy link, deterministic.
// A script defining `async def main()` has it awaited after it ran.
// Exit code: 0 ok, 1 uncaught Python exception, N for sys.exit(N).
import dgram from "node:dgram";
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { loadMicroPython } from "@micropython/micropython-webassembly-pyscript";

const args = process.argv.slice(2);
const libs = [];
const data = [];
const drops = new Map();
let heapsize = 512 * 1024;
let udp = null;
let ptyFd = null;
let config = "{}";
let script = null;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--lib") libs.push(args[++i]);
  else if (a === "--data") data.push(args[++i]);
  else if (a === "--heap") heapsize = Number(args[++i]);
  else if (a === "--udp") udp = args[++i];
  else if (a === "--pty-fd") ptyFd = Number(args[++i]);
  else if (a === "--config") config = args[++i];
  else if (a === "--drop-in") {
    const [type, count] = args[++i].split(":");
    drops.set(parseInt(type, 16), Number(count));
  } else script = a;
}

const inbox = [];
const ctl = [];
let sock = null;
let gwHost = "127.0.0.1";
let gwPort = 0;
if (udp) {
  const at = udp.lastIndexOf(":");
  gwHost = udp.slice(0, at).replace(/^\[|\]$/g, "");
  gwPort = Number(udp.slice(at + 1));
  sock = dgram.createSocket(gwHost.includes(":") ? "udp6" : "udp4");
  sock.on("message", (msg, rinfo) => {
    const type = msg[0] === 1 ? msg[3] : msg[1];
    const left = drops.get(type);
    if (left) {
      drops.set(type, left - 1);
      process.stderr.write(`run.mjs: dropped an incoming datagram of type 0x${type.toString(16)}\n`);
      return;
    }
    inbox.push(`${msg.toString("hex")} ${rinfo.address} ${rinfo.port}`);
  });
  await new Promise((resolve) => sock.bind(0, gwHost.includes(":") ? "::1" : "127.0.0.1", resolve));
}

let ptyIn = Buffer.alloc(0);
let pty = null;
if (ptyFd !== null) {
  pty = fs.createReadStream(null, { fd: ptyFd, autoClose: false, highWaterMark: 4096 });
  pty.on("data", (chunk) => { ptyIn = Buffer.concat([ptyIn, chunk]); });
  pty.on("error", () => {});
}

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", (line) => ctl.push(line));

const mp = await loadMicroPython({
  heapsize,
  stdout: (line) => process.stdout.write(line + "\n"),
  stderr: (line) => process.stderr.write(line + "\n"),
});
mp.FS.mkdirTree("/lib");
for (const dir of libs)
  for (const f of fs.readdirSync(dir))
    if (f.endsWith(".py") || f.endsWith(".mpy"))
      mp.FS.writeFile("/lib/" + f, fs.readFileSync(path.join(dir, f)));
mp.FS.mkdirTree("/data");
for (const file of data) mp.FS.writeFile("/data/" + path.basename(file), fs.readFileSync(file));

mp.registerJsModule("hostio", {
  udp_send: (hex, host, port) => {
    const target = host === "255.255.255.255" ? gwHost : host;
    sock.send(Buffer.from(hex, "hex"), port, target);
  },
  udp_take: () => inbox.shift() ?? "",
  pty_write: (hex) => { fs.writeSync(ptyFd, Buffer.from(hex, "hex")); },
  pty_take: () => {
    const out = ptyIn.toString("hex");
    ptyIn = Buffer.alloc(0);
    return out;
  },
  ctl_take: () => ctl.shift() ?? "",
  config: () => config,
  gateway_port: () => gwPort,
  // JavaScript holds Python objects it was handed until its own collector runs:
  // run it (node --expose-gc) before MicroPython's gc measures.
  js_gc: () => { if (globalThis.gc) globalThis.gc(); },
});

function finish(code) {
  // The client's receive task polls forever, as on a board: exit once output is out.
  process.stdout.write("", () => process.exit(code));
}

try {
  // The script defines things; an `async def main()` in it is then awaited (the
  // port's asyncio runs on node's event loop, as uasyncio runs on a board's).
  mp.runPython(fs.readFileSync(script, "utf8"));
  if (mp.globals.get("main"))
    await mp.runPythonAsync("import asyncio\nawait asyncio.create_task(main())");
  finish(0);
} catch (e) {
  if (e.name !== "PythonError") throw e;
  if (e.type === "SystemExit") {
    const m = /SystemExit: ?(\S*)\s*$/.exec(String(e.message));
    const code = m && m[1] ? parseInt(m[1], 10) : 0;
    finish(Number.isNaN(code) ? 1 : code);
  } else {
    process.stderr.write(String(e.message));
    finish(1);
  }
}
