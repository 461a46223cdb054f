// s3rver_launch.js - starts s3rver (npm) on 127.0.0.1 with an ephemeral
// port for the io suite, creates BUCKET, uploads every file under SEED as
// BUCKET/<relative path>, then writes the port to PORTFILE (renamed into
// place, so the file appearing means "ready with data").
//
//   NODE_PATH=build/npm/node_modules node s3rver_launch.js DIR BUCKET SEED PORTFILE
//
// s3rver verifies SigV4 signatures made with its fixed credentials
// (access key S3RVER, secret S3RVER), so the reads through cachew are
// checked end to end. Stops on SIGTERM.
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');
const S3rver = require('s3rver');

const [dir, bucket, seed, portfile] = process.argv.slice(2);

function walk(root, rel, out) {
  for (const name of fs.readdirSync(path.join(root, rel))) {
    const r = rel ? rel + '/' + name : name;
    if (fs.statSync(path.join(root, r)).isDirectory()) walk(root, r, out);
    else out.push(r);
  }
  return out;
}

function put(port, key, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1', port, method: 'PUT',
      path: '/' + bucket + '/' + key.split('/').map(encodeURIComponent).join('/'),
      headers: { 'Content-Length': body.length },
    }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve()
        : reject(new Error('PUT ' + key + ': HTTP ' + res.statusCode))));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function main() {
  const server = new S3rver({
    address: '127.0.0.1', port: 0, silent: true, directory: dir,
    configureBuckets: [{ name: bucket }],
  });
  const addr = await server.run();
  for (const key of walk(seed, '', [])) {
    await put(addr.port, key, fs.readFileSync(path.join(seed, key)));
  }
  fs.writeFileSync(portfile + '.tmp', String(addr.port) + '\n');
  fs.renameSync(portfile + '.tmp', portfile);
  process.on('SIGTERM', () => server.close().then(() => process.exit(0)));
}

main().catch((err) => {
  process.stderr.write('s3rver_launch: ' + err.stack + '\n');
  process.exit(1);
});
