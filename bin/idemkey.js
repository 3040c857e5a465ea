#!/usr/bin/env node
// The idemkey command: the compiled CLI lives in dist/ (npm install runs the build).
import '../dist/cli/main.js'
